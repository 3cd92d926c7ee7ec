import BoxkeyCore

/// The agent's socket protocol: one request per connection, then replies until a `result`.
/// Frames are a 2-byte big-endian length and a body of at most `maxFrameLength` bytes; a body
/// is a kind byte and its fields (texts and secrets as a 2-byte length and bytes). Decoders take
/// exactly one body and reject anything else.
public enum AgentWire {
    public static let maxFrameLength = 8192

    public enum DecodeError: Error, Equatable, Sendable {
        case empty, unknownKind(UInt8), truncated, trailingBytes, badValue(String)
    }
}

public enum AgentRequest: Sendable {
    /// Box ID nil: the default box.
    case status
    case unlock(pin: SecureBytes)
    case login(box: BoxID?, stay: Bool)
    case act(ActionResult.Action, box: BoxID?)
    case forget
    case stop

    enum Kind: UInt8 { case status = 1, unlock, login, act, forget, stop }

    /// The frame, in secure memory (it may hold a PIN).
    public func frame() -> SecureBytes {
        var w = AgentWireWriter()
        switch self {
        case .status: w.u8(Kind.status.rawValue)
        case .unlock(let pin):
            w.u8(Kind.unlock.rawValue)
            return w.frame(appendingSecret: pin)
        case .login(let box, let stay):
            w.u8(Kind.login.rawValue); w.box(box); w.u8(stay ? 1 : 0)
        case .act(let action, let box):
            w.u8(Kind.act.rawValue); w.u8(action.rawValue); w.box(box)
        case .forget: w.u8(Kind.forget.rawValue)
        case .stop: w.u8(Kind.stop.rawValue)
        }
        return w.frame(appendingSecret: nil)
    }

    public static func decode(_ body: UnsafeRawBufferPointer) throws(AgentWire.DecodeError) -> AgentRequest {
        var r = AgentWireReader(body)
        guard let kind = Kind(rawValue: try r.u8()) else { throw .unknownKind(body.first ?? 0) }
        let request: AgentRequest
        switch kind {
        case .status: request = .status
        case .unlock: request = .unlock(pin: try r.secret())
        case .login: request = .login(box: try r.box(), stay: try r.u8() != 0)
        case .act:
            guard let action = ActionResult.Action(rawValue: try r.u8()), action == .lock || action == .logout else { throw .badValue("action") }
            request = .act(action, box: try r.box())
        case .forget: request = .forget
        case .stop: request = .stop
        }
        try r.end()
        return request
    }
}

public enum AgentReply: Equatable, Sendable {
    /// A line to show while the work goes on ("looking for box 4821… 3 s"), replaced by the next.
    case progress(String)
    /// A line to keep ("Sent. Press Enter at box 4821's password prompt…").
    case say(String)
    /// The agent holds no credentials and the vault has a PIN: send `unlock` first.
    case needPIN
    /// The end: the outcome, the text for the person, and details as JSON (may be empty).
    case result(Outcome, message: String, details: String)

    enum Kind: UInt8 { case progress = 0x81, needPIN, result, say }

    public func frame() -> [UInt8] {
        var w = AgentWireWriter()
        switch self {
        case .progress(let text): w.u8(Kind.progress.rawValue); w.text(text)
        case .needPIN: w.u8(Kind.needPIN.rawValue)
        case .say(let text): w.u8(Kind.say.rawValue); w.text(text)
        case .result(let outcome, let message, let details):
            w.u8(Kind.result.rawValue); w.u8(UInt8(truncatingIfNeeded: outcome.rawValue)); w.text(message); w.text(details)
        }
        return w.frame(appendingSecret: nil).unprotectedCopy
    }

    public static func decode(_ body: UnsafeRawBufferPointer) throws(AgentWire.DecodeError) -> AgentReply {
        var r = AgentWireReader(body)
        guard let kind = Kind(rawValue: try r.u8()) else { throw .unknownKind(body.first ?? 0) }
        let reply: AgentReply
        switch kind {
        case .progress: reply = .progress(try r.text())
        case .needPIN: reply = .needPIN
        case .say: reply = .say(try r.text())
        case .result:
            guard let outcome = Outcome(rawValue: Int32(try r.u8())) else { throw .badValue("outcome") }
            reply = .result(outcome, message: try r.text(), details: try r.text())
        }
        try r.end()
        return reply
    }
}

struct AgentWireWriter {
    var bytes: [UInt8] = []
    mutating func u8(_ v: UInt8) { bytes.append(v) }
    mutating func u16(_ v: Int) { bytes.append(UInt8(v >> 8 & 0xff)); bytes.append(UInt8(v & 0xff)) }
    mutating func box(_ id: BoxID?) { u16(id.map { Int($0.value) } ?? 0xffff) }
    mutating func text(_ s: String) {
        let u = Array(s.utf8.prefix(AgentWire.maxFrameLength / 4))
        u16(u.count); bytes += u
    }
    /// Length prefix and body, with a secret (if any) copied straight into secure memory.
    func frame(appendingSecret secret: SecureBytes?) -> SecureBytes {
        let secretLength = secret.map { 2 + $0.count } ?? 0
        let body = bytes.count + secretLength
        return SecureBytes(count: 2 + body) { out in
            out[0] = UInt8(body >> 8 & 0xff); out[1] = UInt8(body & 0xff)
            for (i, b) in bytes.enumerated() { out[2 + i] = b }
            if let secret {
                let at = 2 + bytes.count
                out[at] = UInt8(secret.count >> 8 & 0xff); out[at + 1] = UInt8(secret.count & 0xff)
                secret.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: out[(at + 2)...]).copyMemory(from: $0) }
            }
        }
    }
}

struct AgentWireReader {
    let body: UnsafeRawBufferPointer
    var at = 0
    init(_ body: UnsafeRawBufferPointer) { self.body = body }

    mutating func take(_ n: Int) throws(AgentWire.DecodeError) -> UnsafeRawBufferPointer {
        guard n >= 0, at + n <= body.count else { throw .truncated }
        defer { at += n }
        return UnsafeRawBufferPointer(rebasing: body[at..<(at + n)])
    }
    mutating func u8() throws(AgentWire.DecodeError) -> UInt8 {
        guard !body.isEmpty else { throw .empty }
        return try take(1)[0]
    }
    mutating func u16() throws(AgentWire.DecodeError) -> Int {
        let b = try take(2)
        return Int(b[0]) << 8 | Int(b[1])
    }
    mutating func box() throws(AgentWire.DecodeError) -> BoxID? {
        let v = try u16()
        if v == 0xffff { return nil }
        guard let id = BoxID(UInt16(v)) else { throw .badValue("box ID") }
        return id
    }
    mutating func text() throws(AgentWire.DecodeError) -> String {
        let n = try u16()
        let b = try take(n)
        guard let s = String(validating: b, as: UTF8.self) else { throw .badValue("text") }
        return s
    }
    mutating func secret() throws(AgentWire.DecodeError) -> SecureBytes {
        let n = try u16()
        return SecureBytes(copying: try take(n))
    }
    func end() throws(AgentWire.DecodeError) {
        guard at == body.count else { throw .trailingBytes }
    }
}
