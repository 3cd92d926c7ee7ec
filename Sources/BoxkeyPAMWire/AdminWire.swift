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

/// The daemon's answer to an admin request: its output (one line per entry, or JSON), or why not.
public enum AdminReply: Equatable, Sendable {
    case text(String)
    case error(String)

    /// The same type bytes as the PAM socket's `ok`, `error` and `text` once were.
    enum Kind: UInt8 { case error = 0x85, text = 0x86 }

    public func encode() -> [UInt8] {
        var w = WireWriter()
        switch self {
        case .error(let m): w.kind(Kind.error.rawValue); w.text(m)
        case .text(let t): w.kind(Kind.text.rawValue); w.longText(t)
        }
        return w.frame()
    }

    public static func decode(_ body: [UInt8]) throws(PAMWire.DecodeError) -> AdminReply {
        var r = try WireReader(body)
        guard let kind = Kind(rawValue: r.kind) else { throw .unknownType(r.kind) }
        let reply: AdminReply
        switch kind {
        case .error: reply = .error(try r.text())
        case .text: reply = .text(try r.longText())
        }
        try r.end()
        return reply
    }
}
