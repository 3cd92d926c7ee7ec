import BoxkeyCore
import BoxkeyHost
import FoundationEssentials

/// The fleet's phones as the directory last said: which users each phone key may log in as.
/// Read whole every `[fleet] refresh_s` (one paged search), kept in `<state>/fleet-roster.json`
/// (0600) so a restarted box works from it while the directory is away, but only for
/// `[fleet] max_stale_s` after the read: then fleet phones are refused (fail closed) until the
/// directory answers again. Local enrolment (`phones.json`) and local revocation are apart
/// from it; a phone revoked at this box stays refused whatever the directory says.
public struct FleetRoster: Sendable, Codable, Equatable {
    public struct Phone: Sendable, Codable, Equatable {
        public var users: [String]
        public var name: String
    }

    /// When the directory was read (wall clock: the age must survive a restart).
    public var readAt: Date
    /// By phone key (64 hex digits).
    public var phones: [String: Phone]
    /// The uidNumber the directory gives each user, where it gives one: a box takes a fleet
    /// phone for a user only if its own user database agrees.
    public var uidNumbers: [String: UInt32] = [:]

    public init(readAt: Date, phones: [String: Phone] = [:]) {
        self.readAt = readAt
        self.phones = phones
    }

    /// Adds the entries of a read: each with its login names, uidNumber and phone values. An
    /// entry with no name or several, a name the fleet does not take (`isFleetName`), and every
    /// entry of a name that another entry's name looks like (`lookalike`), vouch for nobody: a
    /// user who could rename their entry, a copy in another branch, or `Alice` beside `alice`
    /// must not take over another's name. Returns how many values and entries were left out.
    public mutating func add(entries: [(names: [String], number: String?, values: [String])]) -> Int {
        add(prepared: entries.map { Prepared(names: $0.names, number: $0.number, values: $0.values) })
    }

    /// An entry as the roster takes it, its values parsed once (a box following the directory
    /// keeps these, so a change costs it no parsing of the entries that did not change).
    public struct Prepared: Sendable, Equatable {
        public struct Value: Sendable, Equatable {
            let key: String
            let name: String
        }
        let names: [String]
        let lookalikes: Set<String>
        let number: UInt32?
        /// The phones it names (key in hex, name), at most `maxValuesPerEntry`.
        let phones: [Value]
        /// Values that are not phone keys, or past the cap.
        let skipped: Int

        public init(names: [String], number: String?, values: [String]) {
            self.names = names
            lookalikes = Set(names.map(FleetRoster.lookalike))
            self.number = number.flatMap { UInt32($0) }
            var phones: [Value] = []
            for value in values where phones.count < FleetRoster.maxValuesPerEntry {
                if let (key, name) = FleetRoster.parse(value) { phones.append(Value(key: hex(key.bytes), name: name)) }
            }
            self.phones = phones
            skipped = values.count - phones.count
        }
    }

    /// `withholding`: look-alike forms (`lookalike`) of names that vouch for nobody this time.
    public mutating func add(prepared entries: [Prepared], withholding: Set<String> = []) -> Int {
        var skipped = 0
        var entriesPerName: [String: Int] = [:]
        for e in entries {
            for name in e.lookalikes { entriesPerName[name, default: 0] += 1 }
        }
        for e in entries {
            guard e.names.count == 1, Self.isFleetName(e.names[0]), e.lookalikes.first.flatMap({ entriesPerName[$0] }) == 1 else { skipped += 1; continue }
            guard e.lookalikes.isDisjoint(with: withholding) else { continue }
            let user = e.names[0]
            if let n = e.number { uidNumbers[user] = n }
            skipped += e.skipped
            for value in e.phones {
                var phone = phones[value.key] ?? Phone(users: [], name: value.name)
                if !phone.users.contains(user) { phone.users.append(user) }
                phones[value.key] = phone
            }
        }
        return skipped
    }

    /// Adds one directory entry: `user` and the values of its phone attribute. A value that is
    /// not a phone key (hand-edited, another tool's) is skipped and returned, for the log.
    @discardableResult
    public mutating func add(user: String, values: [String]) -> [String] {
        var skipped: [String] = []
        var taken = 0
        for value in values {
            guard taken < Self.maxValuesPerEntry, let (key, name) = Self.parse(value) else { skipped.append(value); continue }
            taken += 1
            let k = hex(key.bytes)
            var phone = phones[k] ?? Phone(users: [], name: name)
            if !phone.users.contains(user) { phone.users.append(user) }
            phones[k] = phone
        }
        return skipped
    }

    /// The users `key` may log in as, or none once the roster is older than `maxStale`.
    public func users(of key: PublicKey, now: Date, maxStale: Duration) -> [String] {
        guard isFresh(now: now, maxStale: maxStale) else { return [] }
        return phones[hex(key.bytes)]?.users ?? []
    }

    public func isFresh(now: Date, maxStale: Duration) -> Bool {
        let age = now.timeIntervalSince(readAt)
        return age >= -60 && age <= Double(maxStale.components.seconds)
    }

    /// Phone keys whose users shrank from `old` to `self` (revoked in the directory), with
    /// the users they lost.
    public func lost(since old: FleetRoster) -> [(key: String, users: [String])] {
        old.phones.compactMap { k, phone in
            let lost = phone.users.filter { !(phones[k]?.users.contains($0) ?? false) }
            return lost.isEmpty ? nil : (k, lost)
        }.sorted { $0.key < $1.key }
    }

    // MARK: - Names

    /// The login names the fleet takes: POSIX portable names in lower case, as Debian's adduser
    /// makes them (`^[a-z_][a-z0-9_.-]*$`, at most 32). A name in another case or script, with
    /// combining marks or spaces, is left to the box's own enrolment: directory servers compare
    /// names case-insensitively and by Unicode compatibility, so such a name could find someone
    /// else's entry.
    public static func isFleetName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard let first = bytes.first, bytes.count <= 32, first == UInt8(ascii: "_") || (first >= 0x61 && first <= 0x7a) else { return false }
        return bytes.allSatisfy { ($0 >= 0x61 && $0 <= 0x7a) || ($0 >= 0x30 && $0 <= 0x39) || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "-") }
    }

    /// What a name looks like to a directory server's matching rules, roughly: lower case,
    /// fullwidth forms as ASCII, without combining marks, format characters or surrounding
    /// spaces. Two entries whose names look alike vouch for nobody.
    public static func lookalike(_ name: String) -> String {
        var out = String.UnicodeScalarView()
        for scalar in name.lowercased().unicodeScalars {
            switch scalar.properties.generalCategory {
            case .nonspacingMark, .spacingMark, .enclosingMark, .format: continue
            default: break
            }
            if (0xFF01...0xFF5E).contains(scalar.value), let ascii = Unicode.Scalar(scalar.value - 0xFEE0) {
                out.append(contentsOf: String(ascii).lowercased().unicodeScalars)
            } else {
                out.append(scalar)
            }
        }
        return String(out).trimmed
    }

    // MARK: - The attribute's values

    /// A value of `boxkeyPhone`: the phone's public key in 64 hex digits, then optionally a
    /// space and a name (printable ASCII: the attribute is an IA5String).
    public static func value(key: PublicKey, name: String) -> String {
        let printable = String(name.unicodeScalars.filter { $0.isASCII && $0.value >= 0x20 && $0.value < 0x7f }.map(Character.init))
            .trimmed.prefix(64)
        return printable.isEmpty ? hex(key.bytes) : "\(hex(key.bytes)) \(printable)"
    }

    /// A person has a phone or two: an entry with more values than this is a mistake or an
    /// attack on the boxes' memory, and the values past it are left out (and logged).
    public static let maxValuesPerEntry = 16
    /// 64 hex digits, a space, a name of at most 64 characters.
    public static let maxValueLength = 64 + 1 + 64

    /// The key and name of a value, or nil for anything else: too long, a character that is not
    /// printable ASCII (NUL, a line break, UTF-8), a leading space, a key not of 64 hex digits.
    public static func parse(_ value: String) -> (key: PublicKey, name: String)? {
        let bytes = value.utf8
        guard bytes.count <= maxValueLength, bytes.first != UInt8(ascii: " "), bytes.allSatisfy({ $0 >= 0x20 && $0 < 0x7f }) else { return nil }
        let parts = value.split(separator: " ", maxSplits: 1)
        guard let first = parts.first, first.count == 64, let bytes = unhex(String(first).lowercased()),
              let key = try? PublicKey(bytes) else { return nil }
        return (key, parts.count > 1 ? String(parts[1]) : "")
    }

    // MARK: - The cache file

    /// The cache's first line: its format and the seal (`FileSeal`) under the box's key; the
    /// roster's JSON follows.
    static let cacheHeader = "boxkey-fleet-cache 1 "
    static let sealLabel = "fleet-roster.json"

    /// The cache, if this box wrote it: `key` is the box's private key.
    public static func load(path: String, sealedBy key: SecureBytes) throws -> FleetRoster? {
        // A cache another account could have written vouches for nobody: not used, said loudly,
        // and the next read of the directory replaces it. So is one whose seal is not this
        // box's: edited, written by another program, restored from another box.
        let bytes: [UInt8]?
        do { bytes = try PrivateFiles.readOwn(path) } catch { throw BoxIdentity.Error(description: "\(error); the next read of the directory replaces it") }
        guard let bytes else { return nil }
        guard let newline = bytes.firstIndex(of: UInt8(ascii: "\n")),
              let first = String(validating: bytes[..<newline], as: UTF8.self), first.hasPrefix(cacheHeader),
              let seal = unhex(String(first.dropFirst(cacheHeader.count))), seal.count == FileSeal.length else {
            throw BoxIdentity.Error(description: "\(path) is not sealed by this box (no seal line): not used; the next read of the directory replaces it")
        }
        let json = Array(bytes[(newline + 1)...])
        guard FileSeal.verify(seal, of: json, key: key, label: sealLabel) else {
            throw BoxIdentity.Error(description: "\(path) was not written by this box (its seal does not match: edited, or from another box): not used; the next read of the directory replaces it")
        }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        do { return try decoder.decode(FleetRoster.self, from: Data(json)) } catch {
            throw BoxIdentity.Error(description: "\(path) is corrupt (\(error)); it is only a cache: the next read of the directory replaces it")
        }
    }

    public func save(path: String, sealedBy key: SecureBytes) throws {
        let json = cacheJSON()
        let seal = FileSeal.seal(json, key: key, label: Self.sealLabel)
        try PrivateFiles.write(Data(Array((Self.cacheHeader + hex(seal) + "\n").utf8) + json), to: path)
    }

    /// The roster as JSON (what `JSONEncoder` with sorted keys and ISO 8601 dates writes, which
    /// `load` decodes), written by hand: a following box writes it after each revocation, and
    /// the encoder took most of the time a change cost a box with 2,000 phones.
    func cacheJSON() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(100 * phones.count + 64)
        func string(_ text: String) {
            out.append(UInt8(ascii: "\""))
            for byte in text.utf8 {
                switch byte {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"): out += [UInt8(ascii: "\\"), byte]
                case 0..<0x20: out += Array("\\u00".utf8) + [hexDigit(byte >> 4), hexDigit(byte & 0xf)]
                default: out.append(byte)
                }
            }
            out.append(UInt8(ascii: "\""))
        }
        func raw(_ text: String) { out += Array(text.utf8) }
        func hexDigit(_ n: UInt8) -> UInt8 { n < 10 ? UInt8(ascii: "0") + n : UInt8(ascii: "a") + n - 10 }
        raw("{\"phones\":{")
        for (i, (k, phone)) in phones.sorted(by: { $0.key < $1.key }).enumerated() {
            if i > 0 { raw(",") }
            string(k)
            raw(":{\"name\":")
            string(phone.name)
            raw(",\"users\":[")
            for (j, user) in phone.users.enumerated() {
                if j > 0 { raw(",") }
                string(user)
            }
            raw("]}")
        }
        raw("},\"readAt\":")
        string(readAt.ISO8601Format())
        raw(",\"uidNumbers\":{")
        for (i, (user, number)) in uidNumbers.sorted(by: { $0.key < $1.key }).enumerated() {
            if i > 0 { raw(",") }
            string(user)
            raw(":\(number)")
        }
        raw("}}")
        return out
    }
}
