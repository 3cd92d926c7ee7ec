/// The admin socket's protocol (root only, `/run/boxkey/admin.sock`): `boxkeyd status`,
/// `phones`, `pair-code` and `reload` ask the running daemon. The framing is the PAM socket's
/// (`PAMWire`); the requests and replies are its own, so neither socket's decoder knows the
/// other's requests and the PAM module has no admin vocabulary at all.
public enum AdminRequest: Equatable, Sendable {
    case listPhones
    case revokePhone(fingerprint: String)
    case daemonStatus
    /// A new pairing code, for one user if `user` is not empty.
    case newPairingCode(user: String)
    case enrolPhone(key: String, user: String, name: String)
    /// Re-read the configuration file now, answering with what changed or why not.
    case reload

    enum Kind: UInt8, CaseIterable {
        case listPhones = 0x10, revokePhone = 0x11, daemonStatus = 0x12, newPairingCode = 0x13, enrolPhone = 0x14, reload = 0x15
    }

    /// For logs and errors: an admin request's name, from its type byte (nil: not one).
    public static func name(ofType type: UInt8) -> String? { Kind(rawValue: type).map { "\($0)" } }

    public func encode() -> [UInt8] {
        var w = WireWriter()
        switch self {
        case .listPhones: w.kind(Kind.listPhones.rawValue)
        case .revokePhone(let fp): w.kind(Kind.revokePhone.rawValue); w.text(fp)
        case .daemonStatus: w.kind(Kind.daemonStatus.rawValue)
        case .newPairingCode(let user): w.kind(Kind.newPairingCode.rawValue); w.text(user)
        case .enrolPhone(let key, let user, let name): w.kind(Kind.enrolPhone.rawValue); w.text(key); w.text(user); w.text(name)
        case .reload: w.kind(Kind.reload.rawValue)
        }
        return w.frame()
    }

    /// Decodes one frame body (without the 2-byte length).
    public static func decode(_ body: [UInt8]) throws(PAMWire.DecodeError) -> AdminRequest {
        var r = try WireReader(body)
        guard let kind = Kind(rawValue: r.kind) else { throw .unknownType(r.kind) }
        let request: AdminRequest
        switch kind {
        case .listPhones: request = .listPhones
        case .revokePhone: request = .revokePhone(fingerprint: try r.text())
        case .daemonStatus: request = .daemonStatus
        case .newPairingCode: request = .newPairingCode(user: try r.text())
        case .enrolPhone: request = .enrolPhone(key: try r.text(), user: try r.text(), name: try r.text())
        case .reload: request = .reload
        }
        try r.end()
        return request
    }
}

/// The daemon's answer to an admin request: its output (one line per entry, or JSON), or why
/// not. Output longer than a frame (a box with many phones) goes in parts: `part` frames, then
/// the last as `text`, each part whole characters; `Reader` puts them together.
public enum AdminReply: Equatable, Sendable {
    case text(String)
    case error(String)

    /// `error` and `text` keep the type bytes they had on the shared socket; `part` is new.
    enum Kind: UInt8 { case error = 0x85, text = 0x86, part = 0x8a }

    /// The most a part carries: a frame less its version, type and 2-byte length.
    static let partBytes = PAMWire.maxFrameLength - 4
    /// The most a reply carries in all: the reader refuses more.
    public static let maxTextBytes = 4 << 20

    /// The reply's frames, one after another (several for a long text).
    public func encode() -> [UInt8] {
        switch self {
        case .error(let m):
            var w = WireWriter()
            w.kind(Kind.error.rawValue); w.text(m)
            return w.frame()
        case .text(let t):
            var parts = Self.split(t)
            let last = parts.removeLast()
            var out: [UInt8] = []
            for part in parts {
                var w = WireWriter()
                w.kind(Kind.part.rawValue); w.longText(part)
                out += w.frame()
            }
            var w = WireWriter()
            w.kind(Kind.text.rawValue); w.longText(last)
            return out + w.frame()
        }
    }

    /// `text` in pieces of at most `partBytes` bytes, cut between characters (at least one piece).
    static func split(_ text: String) -> [String] {
        var parts: [String] = []
        var current = ""
        var bytes = 0
        for c in text.unicodeScalars {
            let n = String(c).utf8.count
            if bytes + n > partBytes { parts.append(current); current = ""; bytes = 0 }
            current.unicodeScalars.append(c)
            bytes += n
        }
        parts.append(current)
        return parts
    }

    /// Reads a reply frame by frame.
    public struct Reader: Sendable {
        var parts = ""
        var bytes = 0
        public init() {}

        /// The reply once its last frame is read; nil while parts are still coming.
        public mutating func read(_ body: [UInt8]) throws(PAMWire.DecodeError) -> AdminReply? {
            var r = try WireReader(body)
            guard let kind = Kind(rawValue: r.kind) else { throw .unknownType(r.kind) }
            let reply: AdminReply?
            switch kind {
            case .error:
                guard bytes == 0 else { throw .invalidValue(r.kind) }  // an error ends no text
                reply = .error(try r.text())
            case .part, .text:
                let piece = try r.longText()
                bytes += piece.utf8.count
                guard bytes <= AdminReply.maxTextBytes else { throw .tooLong(bytes) }
                parts += piece
                reply = kind == .text ? .text(parts) : nil
            }
            try r.end()
            return reply
        }
    }
}
