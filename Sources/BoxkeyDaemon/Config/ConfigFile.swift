/// The syntax of `boxkeyd.conf`: the part of TOML 1.0 (https://toml.io/en/v1.0.0) that a
/// flat configuration file uses — `[section]` headers, `key = value` lines, comments — with
/// values that are strings (basic, with TOML's escapes, or literal), integers, floats,
/// booleans and arrays of those (which may span lines). What TOML has beyond that (dotted
/// or quoted keys, inline tables, arrays of tables, multi-line strings, dates, hex numbers)
/// is an error that says so.
///
/// Every malformed input is an error naming its line; nothing here traps or aborts. It is
/// fuzzed (`Fuzz/Sources/FuzzConfig`), and it replaced a TOML library whose C++ parser
/// aborted the daemon on a malformed table header.
struct ConfigFile {
    enum Value: Equatable, Sendable {
        case string(String)
        case integer(Int)
        case float(Double)
        case bool(Bool)
        case array([Value])
    }

    struct Entry: Equatable, Sendable {
        let value: Value
        let line: Int
    }

    struct Section: Sendable {
        let name: String
        let line: Int
        /// In file order; a key appears once.
        var entries: [(key: String, entry: Entry)] = []

        subscript(key: String) -> Entry? { entries.first { $0.key == key }?.entry }
    }

    /// In file order; a section appears once.
    fileprivate(set) var sections: [Section] = []

    subscript(name: String) -> Section? { sections.first { $0.name == name } }

    struct SyntaxError: Error, Equatable, CustomStringConvertible {
        let line: Int
        let message: String
        var description: String { "line \(line): \(message)" }
    }

    /// `later` over this one: its keys replace these, its sections add to these (drop-ins).
    mutating func merge(_ later: ConfigFile) {
        for section in later.sections {
            guard let i = sections.firstIndex(where: { $0.name == section.name }) else {
                sections.append(section)
                continue
            }
            for (key, entry) in section.entries {
                if let j = sections[i].entries.firstIndex(where: { $0.key == key }) {
                    sections[i].entries[j].entry = entry
                } else {
                    sections[i].entries.append((key, entry))
                }
            }
        }
    }

    static func parse(_ text: String) throws(SyntaxError) -> ConfigFile {
        var parser = Parser(bytes: Array(text.utf8))
        return try parser.file()
    }
}

private struct Parser {
    let bytes: [UInt8]
    var i = 0
    var line = 1

    init(bytes: [UInt8]) { self.bytes = bytes }

    var atEnd: Bool { i >= bytes.count }
    var peek: UInt8? { i < bytes.count ? bytes[i] : nil }

    func fail(_ message: String) -> ConfigFile.SyntaxError { .init(line: line, message: message) }

    mutating func file() throws(ConfigFile.SyntaxError) -> ConfigFile {
        var result = ConfigFile()
        var current: Int?  // index into result.sections
        while !atEnd {
            skipBlanks()
            switch peek {
            case nil:
                break
            case UInt8(ascii: "#"), UInt8(ascii: "\n"), UInt8(ascii: "\r"):
                break
            case UInt8(ascii: "["):
                let at = line
                let name = try header()
                if result.sections.contains(where: { $0.name == name }) {
                    throw fail("section [\(name)] appears twice (TOML allows a table to be defined once)")
                }
                result.sections.append(.init(name: name, line: at))
                current = result.sections.count - 1
            default:
                let at = line
                let key = try bareKey(what: "a key")
                skipBlanks()
                guard peek == UInt8(ascii: "=") else {
                    if peek == UInt8(ascii: ".") { throw fail("dotted keys are not used in boxkeyd.conf: write [section] and key = value") }
                    throw fail("expected = after \(key)")
                }
                i += 1
                skipBlanks()
                let value = try self.value(depth: 0)
                guard let s = current else { throw fail("\(key) is outside any [section]") }
                if result.sections[s][key] != nil {
                    throw fail("\(key) appears twice in [\(result.sections[s].name)]")
                }
                result.sections[s].entries.append((key, .init(value: value, line: at)))
            }
            try endOfLine()
        }
        return result
    }

    /// Blanks, an optional comment, then a line end or the end of the text.
    mutating func endOfLine() throws(ConfigFile.SyntaxError) {
        skipBlanks()
        try skipComment()
        guard !atEnd else { return }
        guard try newline() else { throw fail("unexpected \(describe(peek!)) after the value") }
    }

    mutating func skipBlanks() {
        while let c = peek, c == 0x20 || c == 0x09 { i += 1 }
    }

    /// A comment runs to the line's end; TOML allows no control characters in it but tab.
    mutating func skipComment() throws(ConfigFile.SyntaxError) {
        guard peek == UInt8(ascii: "#") else { return }
        while let c = peek, c != 0x0a, c != 0x0d {
            if isForbiddenControl(c) { throw fail("control character \(describe(c)) in a comment") }
            i += 1
        }
    }

    /// Consumes LF or CRLF; a lone CR is an error (it would hide a line break).
    mutating func newline() throws(ConfigFile.SyntaxError) -> Bool {
        switch peek {
        case 0x0a:
            i += 1
        case 0x0d:
            guard i + 1 < bytes.count, bytes[i + 1] == 0x0a else { throw fail("a carriage return without a line feed") }
            i += 2
        default:
            return false
        }
        line += 1
        return true
    }

    mutating func header() throws(ConfigFile.SyntaxError) -> String {
        i += 1  // [
        if peek == UInt8(ascii: "[") { throw fail("arrays of tables ([[…]]) are not used in boxkeyd.conf") }
        skipBlanks()
        let name = try bareKey(what: "a section name")
        skipBlanks()
        guard peek == UInt8(ascii: "]") else {
            if peek == UInt8(ascii: ".") { throw fail("dotted section names are not used in boxkeyd.conf") }
            throw fail("expected ] to close [\(name)")
        }
        i += 1
        return name
    }

    /// TOML's bare key: ASCII letters, digits, `_` and `-`.
    mutating func bareKey(what: String) throws(ConfigFile.SyntaxError) -> String {
        let start = i
        while let c = peek, isBareKeyByte(c) { i += 1 }
        guard i > start else {
            if let c = peek, c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") {
                throw fail("quoted names are not used in boxkeyd.conf")
            }
            throw fail("expected \(what), found \(peek.map(describe) ?? "the end of the file")")
        }
        return String(decoding: bytes[start..<i], as: UTF8.self)
    }

    /// Arrays nest at most this deep: a value of boxkeyd.conf is at most a list of scalars,
    /// and a bound keeps a crafted file from exhausting the stack.
    static let maxDepth = 4

    mutating func value(depth: Int) throws(ConfigFile.SyntaxError) -> ConfigFile.Value {
        guard let c = peek else { throw fail("a value is missing") }
        switch c {
        case UInt8(ascii: "\""):
            if starts(with: "\"\"\"") { throw fail("multi-line strings are not used in boxkeyd.conf") }
            return .string(try basicString())
        case UInt8(ascii: "'"):
            if starts(with: "'''") { throw fail("multi-line strings are not used in boxkeyd.conf") }
            return .string(try literalString())
        case UInt8(ascii: "["):
            guard depth < Self.maxDepth else { throw fail("arrays nested too deep") }
            return .array(try array(depth: depth + 1))
        case UInt8(ascii: "{"):
            throw fail("inline tables are not used in boxkeyd.conf")
        case UInt8(ascii: "t") where starts(with: "true"):
            i += 4
            try endOfScalar()
            return .bool(true)
        case UInt8(ascii: "f") where starts(with: "false"):
            i += 5
            try endOfScalar()
            return .bool(false)
        case UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return try number()
        default:
            throw fail("not a value: \(describe(c)) (strings need quotes)")
        }
    }

    func starts(with s: String) -> Bool {
        let wanted = Array(s.utf8)
        guard i + wanted.count <= bytes.count else { return false }
        return bytes[i..<(i + wanted.count)].elementsEqual(wanted)
    }

    /// What may follow a bare scalar (`true`, a number): blanks, a comment, a line end, a
    /// comma or `]` inside an array, or the end of the file.
    func endOfScalar() throws(ConfigFile.SyntaxError) {
        guard let c = peek else { return }
        switch c {
        case 0x20, 0x09, 0x0a, 0x0d, UInt8(ascii: "#"), UInt8(ascii: ","), UInt8(ascii: "]"): return
        default: throw fail("unexpected \(describe(c)) in a value")
        }
    }

    mutating func array(depth: Int) throws(ConfigFile.SyntaxError) -> [ConfigFile.Value] {
        i += 1  // [
        var items: [ConfigFile.Value] = []
        while true {
            try skipArraySpace()
            guard let c = peek else { throw fail("an array is not closed with ]") }
            if c == UInt8(ascii: "]") { i += 1; return items }
            items.append(try value(depth: depth))
            try skipArraySpace()
            switch peek {
            case UInt8(ascii: ","): i += 1
            case UInt8(ascii: "]"): i += 1; return items
            case nil: throw fail("an array is not closed with ]")
            case let c?: throw fail("expected , or ] in an array, found \(describe(c))")
            }
        }
    }

    /// Inside an array, blanks, comments and line breaks may come between values.
    mutating func skipArraySpace() throws(ConfigFile.SyntaxError) {
        while true {
            skipBlanks()
            try skipComment()
            guard try newline() else { return }
        }
    }

    mutating func basicString() throws(ConfigFile.SyntaxError) -> String {
        i += 1  // "
        var out: [UInt8] = []
        while true {
            guard let c = peek else { throw fail("a string is not closed with \"") }
            i += 1
            switch c {
            case UInt8(ascii: "\""):
                return String(decoding: out, as: UTF8.self)
            case UInt8(ascii: "\\"):
                guard let e = peek else { throw fail("a string is not closed with \"") }
                i += 1
                switch e {
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "n"): out.append(0x0a)
                case UInt8(ascii: "f"): out.append(0x0c)
                case UInt8(ascii: "r"): out.append(0x0d)
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5c)
                case UInt8(ascii: "u"): out += try unicodeEscape(digits: 4)
                case UInt8(ascii: "U"): out += try unicodeEscape(digits: 8)
                default: throw fail("unknown escape \\\(String(decoding: [e], as: UTF8.self)) in a string")
                }
            case 0x0a, 0x0d:
                throw fail("a string is not closed with \" on its line")
            default:
                if isForbiddenControl(c) { throw fail("control character \(describe(c)) in a string") }
                out.append(c)
            }
        }
    }

    mutating func unicodeEscape(digits: Int) throws(ConfigFile.SyntaxError) -> [UInt8] {
        guard i + digits <= bytes.count,
              let n = UInt32(String(decoding: bytes[i..<(i + digits)], as: UTF8.self), radix: 16),
              bytes[i..<(i + digits)].allSatisfy(isHexDigit),
              let scalar = Unicode.Scalar(n) else {
            throw fail("a \\u or \\U escape needs \(digits) hex digits naming a Unicode scalar")
        }
        i += digits
        return Array(String(Character(scalar)).utf8)
    }

    mutating func literalString() throws(ConfigFile.SyntaxError) -> String {
        i += 1  // '
        let start = i
        while true {
            guard let c = peek else { throw fail("a string is not closed with '") }
            if c == UInt8(ascii: "'") { break }
            if c == 0x0a || c == 0x0d { throw fail("a string is not closed with ' on its line") }
            if isForbiddenControl(c) { throw fail("control character \(describe(c)) in a string") }
            i += 1
        }
        defer { i += 1 }
        return String(decoding: bytes[start..<i], as: UTF8.self)
    }

    /// TOML's decimal integers and floats: an optional sign, no leading zeros, `_` only
    /// between digits; a float has a fraction, an exponent or both.
    mutating func number() throws(ConfigFile.SyntaxError) -> ConfigFile.Value {
        let start = i
        while let c = peek, isNumberByte(c) { i += 1 }
        let token = String(decoding: bytes[start..<i], as: UTF8.self)
        try endOfScalar()
        var body = Substring(token)
        if body.first == "+" || body.first == "-" { body = body.dropFirst() }
        if body.hasPrefix("0x") || body.hasPrefix("0o") || body.hasPrefix("0b") {
            throw fail("write \(token) in decimal")
        }
        guard validUnderscores(body) else { throw fail("not a number: \(token)") }
        let plain = token.filter { $0 != "_" }
        let unsigned = plain.drop { $0 == "+" || $0 == "-" }
        let isFloat = unsigned.contains { $0 == "." || $0 == "e" || $0 == "E" }
        let integerPart = unsigned.prefix { $0.isASCII && $0.isNumber }
        guard !integerPart.isEmpty else { throw fail("not a number: \(token)") }
        if integerPart.count > 1 && integerPart.first == "0" { throw fail("leading zeros are not allowed: \(token)") }
        if isFloat {
            guard floatShape(unsigned), let d = Double(plain), d.isFinite else { throw fail("not a number: \(token)") }
            return .float(d)
        }
        guard unsigned.allSatisfy({ $0.isASCII && $0.isNumber }) else { throw fail("not a number: \(token)") }
        guard let n = Int(plain) else { throw fail("\(token) is out of range") }
        return .integer(n)
    }

    /// digits [ . digits ] [ (e|E) [+-] digits ], with the integer part already checked.
    private func floatShape(_ s: Substring) -> Bool {
        var rest = s.drop { $0.isASCII && $0.isNumber }
        if rest.first == "." {
            rest = rest.dropFirst()
            let digits = rest.prefix { $0.isASCII && $0.isNumber }
            guard !digits.isEmpty else { return false }
            rest = rest.dropFirst(digits.count)
        }
        if rest.first == "e" || rest.first == "E" {
            rest = rest.dropFirst()
            if rest.first == "+" || rest.first == "-" { rest = rest.dropFirst() }
            let digits = rest.prefix { $0.isASCII && $0.isNumber }
            guard !digits.isEmpty else { return false }
            rest = rest.dropFirst(digits.count)
        }
        return rest.isEmpty
    }

    /// `_` only between two digits.
    private func validUnderscores(_ s: Substring) -> Bool {
        let chars = Array(s)
        for (k, c) in chars.enumerated() where c == "_" {
            guard k > 0, k + 1 < chars.count, chars[k - 1].isNumber, chars[k + 1].isNumber else { return false }
        }
        return true
    }
}

private func isBareKeyByte(_ c: UInt8) -> Bool {
    (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || c == UInt8(ascii: "_") || c == UInt8(ascii: "-")
}

private func isNumberByte(_ c: UInt8) -> Bool {
    isBareKeyByte(c) || c == UInt8(ascii: "+") || c == UInt8(ascii: ".") || c == UInt8(ascii: ":")
}

private func isHexDigit(_ c: UInt8) -> Bool {
    (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66)
}

/// TOML allows no control characters but tab in strings and comments (U+0000–U+001F, U+007F).
private func isForbiddenControl(_ c: UInt8) -> Bool {
    (c < 0x20 && c != 0x09) || c == 0x7f
}

/// A byte as an admin can read it in an error message.
private func describe(_ c: UInt8) -> String {
    if c >= 0x21 && c < 0x7f { return "'\(String(decoding: [c], as: UTF8.self))'" }
    let hex = String(c, radix: 16, uppercase: true)
    return "byte 0x\(hex.count == 1 ? "0" + hex : hex)"
}
