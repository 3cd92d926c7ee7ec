import CDBus

/// One D-Bus value with its type. Containers carry their element signature so an empty array
/// still marshals with the right type.
public indirect enum DBusValue: Sendable, Hashable {
    case byte(UInt8)
    case bool(Bool)
    case int16(Int16)
    case uint16(UInt16)
    case int32(Int32)
    case uint32(UInt32)
    case int64(Int64)
    case uint64(UInt64)
    case double(Double)
    case string(String)
    case objectPath(String)
    case signature(String)
    /// A Unix file descriptor. Received ones are owned by the receiver (libdbus dup()s them);
    /// sent ones stay owned by the sender (libdbus dup()s them again).
    case unixFD(Int32)
    case array(elementSignature: String, [DBusValue])
    case dictEntry(DBusValue, DBusValue)
    case structure([DBusValue])
    case variant(DBusValue)

    public var signature: String {
        switch self {
        case .byte: "y"
        case .bool: "b"
        case .int16: "n"
        case .uint16: "q"
        case .int32: "i"
        case .uint32: "u"
        case .int64: "x"
        case .uint64: "t"
        case .double: "d"
        case .string: "s"
        case .objectPath: "o"
        case .signature: "g"
        case .unixFD: "h"
        case .array(let element, _): "a" + element
        case .dictEntry(let k, let v): "{" + k.signature + v.signature + "}"
        case .structure(let fields): "(" + fields.map(\.signature).joined() + ")"
        case .variant: "v"
        }
    }
}

// MARK: - Building values

extension DBusValue {
    public static func bytes(_ b: [UInt8]) -> DBusValue { .array(elementSignature: "y", b.map { .byte($0) }) }
    public static func strings(_ s: [String]) -> DBusValue { .array(elementSignature: "s", s.map { .string($0) }) }
    public static func objectPaths(_ s: [String]) -> DBusValue { .array(elementSignature: "o", s.map { .objectPath($0) }) }

    /// `a{sv}`, the property and option dictionary of most D-Bus APIs. Keys are sorted so the
    /// wire form is deterministic.
    public static func vardict(_ d: [String: DBusValue]) -> DBusValue {
        .array(elementSignature: "{sv}", d.keys.sorted().map { .dictEntry(.string($0), .variant(d[$0]!)) })
    }

    /// A dictionary with any basic key type and a fixed value signature.
    public static func dict(keySignature: String, valueSignature: String, _ entries: [(DBusValue, DBusValue)]) -> DBusValue {
        .array(elementSignature: "{" + keySignature + valueSignature + "}", entries.map { .dictEntry($0.0, $0.1) })
    }
}

// MARK: - Reading values

extension DBusValue {
    /// The value inside any number of variants.
    public var unwrapped: DBusValue {
        if case .variant(let inner) = self { return inner.unwrapped }
        return self
    }

    public var string: String? {
        switch unwrapped {
        case .string(let s), .objectPath(let s), .signature(let s): s
        default: nil
        }
    }

    public var bool: Bool? {
        if case .bool(let b) = unwrapped { return b }
        return nil
    }

    /// Any integer type, widened.
    public var int: Int? {
        switch unwrapped {
        case .byte(let v): Int(v)
        case .int16(let v): Int(v)
        case .uint16(let v): Int(v)
        case .int32(let v): Int(v)
        case .uint32(let v): Int(v)
        case .int64(let v): Int(v)
        case .uint64(let v): Int(exactly: v)
        default: nil
        }
    }

    public var elements: [DBusValue]? {
        if case .array(_, let e) = unwrapped { return e }
        return nil
    }

    public var bytes: [UInt8]? {
        guard let e = elements else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(e.count)
        for v in e {
            guard case .byte(let b) = v else { return nil }
            out.append(b)
        }
        return out
    }

    public var strings: [String]? {
        guard let e = elements else { return nil }
        let s = e.compactMap(\.string)
        return s.count == e.count ? s : nil
    }

    /// Dictionary entries of an array of dict entries, keys as given.
    public var entries: [(key: DBusValue, value: DBusValue)]? {
        guard let e = elements else { return nil }
        var out: [(key: DBusValue, value: DBusValue)] = []
        for v in e {
            guard case .dictEntry(let k, let val) = v else { return nil }
            out.append((k, val))
        }
        return out
    }

    /// `a{sv}` (or any string-keyed dict) as a Swift dictionary, variants unwrapped.
    public var vardict: [String: DBusValue]? {
        guard let e = entries else { return nil }
        var out: [String: DBusValue] = [:]
        for (k, v) in e {
            guard let key = k.string else { return nil }
            out[key] = v.unwrapped
        }
        return out
    }
}

// MARK: - Marshalling (libdbus iterators)

enum DBusType {
    static func code(_ c: Character) -> Int32 { Int32(c.asciiValue!) }
    static let invalid: Int32 = 0
    static let array = code("a")
    static let variant = code("v")
    static let structure = code("r")
    static let dictEntry = code("e")
}

extension DBusValue {
    func append(to iter: inout DBusMessageIter) -> Bool {
        func basic<T>(_ type: Character, _ value: T) -> Bool {
            var v = value
            return dbus_message_iter_append_basic(&iter, DBusType.code(type), &v) != 0
        }
        switch self {
        case .byte(let v): return basic("y", v)
        case .bool(let v): return basic("b", dbus_bool_t(v ? 1 : 0))
        case .int16(let v): return basic("n", v)
        case .uint16(let v): return basic("q", v)
        case .int32(let v): return basic("i", v)
        case .uint32(let v): return basic("u", v)
        case .int64(let v): return basic("x", v)
        case .uint64(let v): return basic("t", v)
        case .double(let v): return basic("d", v)
        case .unixFD(let v): return basic("h", v)
        case .string(let s), .objectPath(let s), .signature(let s):
            // libdbus aborts the process on invalid UTF-8 or a malformed path; check first.
            guard s.utf8.allSatisfy({ $0 != 0 }) else { return false }
            if case .objectPath = self, !DBusValue.isValidObjectPath(s) { return false }
            let type: Character = if case .string = self { "s" } else if case .objectPath = self { "o" } else { "g" }
            if type == "g", dbus_signature_validate(s, nil) == 0 { return false }
            return s.withCString { p in
                var pointer: UnsafePointer<CChar>? = p
                return dbus_message_iter_append_basic(&iter, DBusType.code(type), &pointer) != 0
            }
        case .array(let element, let values):
            guard dbus_signature_validate_single("a" + element, nil) != 0 else { return false }
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, DBusType.array, element, &sub) != 0 else { return false }
            var ok = true
            if element == "y", let bytes = self.bytes {
                ok = bytes.withUnsafeBufferPointer { buffer in
                    var base = buffer.baseAddress ?? UnsafePointer(bitPattern: 1)!
                    return dbus_message_iter_append_fixed_array(&sub, DBusType.code("y"), &base, Int32(buffer.count)) != 0
                }
            } else {
                for v in values where ok {
                    ok = v.signature == element && v.append(to: &sub)
                }
            }
            if !ok { dbus_message_iter_abandon_container(&iter, &sub); return false }
            return dbus_message_iter_close_container(&iter, &sub) != 0
        case .dictEntry(let k, let v):
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, DBusType.dictEntry, nil, &sub) != 0 else { return false }
            guard k.append(to: &sub), v.append(to: &sub) else { dbus_message_iter_abandon_container(&iter, &sub); return false }
            return dbus_message_iter_close_container(&iter, &sub) != 0
        case .structure(let fields):
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, DBusType.structure, nil, &sub) != 0 else { return false }
            for f in fields where !f.append(to: &sub) { dbus_message_iter_abandon_container(&iter, &sub); return false }
            return dbus_message_iter_close_container(&iter, &sub) != 0
        case .variant(let inner):
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, DBusType.variant, inner.signature, &sub) != 0 else { return false }
            guard inner.append(to: &sub) else { dbus_message_iter_abandon_container(&iter, &sub); return false }
            return dbus_message_iter_close_container(&iter, &sub) != 0
        }
    }

    /// Reads every value from `iter` to its end.
    static func readAll(_ iter: inout DBusMessageIter) -> [DBusValue] {
        var out: [DBusValue] = []
        while dbus_message_iter_get_arg_type(&iter) != DBusType.invalid {
            out.append(read(&iter))
            dbus_message_iter_next(&iter)
        }
        return out
    }

    static func read(_ iter: inout DBusMessageIter) -> DBusValue {
        let type = dbus_message_iter_get_arg_type(&iter)
        func basic<T>(_ initial: T) -> T {
            var v = initial
            dbus_message_iter_get_basic(&iter, &v)
            return v
        }
        func text() -> String {
            var p: UnsafePointer<CChar>? = nil
            dbus_message_iter_get_basic(&iter, &p)
            return p.map { String(cString: $0) } ?? ""
        }
        switch UInt8(truncatingIfNeeded: type) {
        case UInt8(ascii: "y"): return .byte(basic(UInt8(0)))
        case UInt8(ascii: "b"): return .bool(basic(dbus_bool_t(0)) != 0)
        case UInt8(ascii: "n"): return .int16(basic(Int16(0)))
        case UInt8(ascii: "q"): return .uint16(basic(UInt16(0)))
        case UInt8(ascii: "i"): return .int32(basic(Int32(0)))
        case UInt8(ascii: "u"): return .uint32(basic(UInt32(0)))
        case UInt8(ascii: "x"): return .int64(basic(Int64(0)))
        case UInt8(ascii: "t"): return .uint64(basic(UInt64(0)))
        case UInt8(ascii: "d"): return .double(basic(Double(0)))
        case UInt8(ascii: "h"): return .unixFD(basic(Int32(-1)))
        case UInt8(ascii: "s"): return .string(text())
        case UInt8(ascii: "o"): return .objectPath(text())
        case UInt8(ascii: "g"): return .signature(text())
        case UInt8(ascii: "a"):
            let full = dbus_message_iter_get_signature(&iter)
            defer { dbus_free(full) }
            let element = String(String(cString: full!).dropFirst())
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            if element == "y" {
                var base: UnsafePointer<UInt8>? = nil
                var count: Int32 = 0
                dbus_message_iter_get_fixed_array(&sub, &base, &count)
                let bytes = base.map { Array(UnsafeBufferPointer(start: $0, count: Int(count))) } ?? []
                return .bytes(bytes)
            }
            return .array(elementSignature: element, readAll(&sub))
        case UInt8(ascii: "e"):
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            let key = read(&sub)
            dbus_message_iter_next(&sub)
            return .dictEntry(key, read(&sub))
        case UInt8(ascii: "r"):
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            return .structure(readAll(&sub))
        case UInt8(ascii: "v"):
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            return .variant(read(&sub))
        default:
            // libdbus validated the message; every type it can carry is handled above.
            return .structure([])
        }
    }

    /// D-Bus spec: "/" or "/"-separated non-empty elements of [A-Za-z0-9_].
    public static func isValidObjectPath(_ s: String) -> Bool {
        if s == "/" { return true }
        guard s.hasPrefix("/"), !s.hasSuffix("/") else { return false }
        return s.dropFirst().split(separator: "/", omittingEmptySubsequences: false).allSatisfy { element in
            !element.isEmpty && element.utf8.allSatisfy { c in
                (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x5F
            }
        }
    }
}
