/// The protocol on the box's root-only Unix socket between `pam_boxkey.so` and the daemon (the
/// daemon's side; the module's is `Sources/pam_boxkey/wire.c`, checked against this one by
/// PAMWireCrossTests). The admin socket has the same framing and its own messages (`AdminRequest`).
///
/// Frame: `length (2, BE, of what follows) | version (1) | type (1) | body`. Strings are
/// `length (1) | UTF-8`; the password is `length (2, BE) | bytes`. Decoders are exact.
public enum PAMWire {
    /// 3: the module asks at once and a push waits at the prompt for Enter (`intent`); 2 waited
    /// for the push before any prompt.
    public static let version: UInt8 = 3
    public static let maxFrameLength = 2048
    /// Where boxkeyd listens and pam_boxkey connects by default.
    public static let defaultSocketPath = "/run/boxkey/pam.sock"
    /// PAM_RHOST values that name this machine: the module passes them to the daemon, which
    /// accepts them only when logind says the session is local; any other host is remote.
    public static let loopbackHosts: Set<String> = ["localhost", "localhost.localdomain", "127.0.0.1", "::1"]

    public enum DecodeError: Error, Equatable, Sendable {
        case truncated
        case trailingBytes
        case unsupportedVersion(UInt8)
        case unknownType(UInt8)
        case tooLong(Int)
        case invalidText
        case invalidValue(UInt8)
    }
}

/// Module to daemon.
public enum PAMRequest: Equatable, Sendable {
    /// Opens a prompt for phone login. Answered at once with `.prompt` (what to show) or
    /// `.notOffered`. While the module then asks the person for the password, a phone's push
    /// for this prompt waits at the box for Enter there (`intent`). Once per connection.
    case waitForPush(WaitRequest)
    /// The prompt is over without the phone: the person typed a password, cancelled, or the
    /// module gave up.
    case cancel
    /// The final outcome of the PAM stack for the push this connection received.
    case reportOutcome(Verdict, reason: String)
    /// Escrow capture: the password the person typed, sent only after the stack accepted it
    /// and just before `reportOutcome`. The bytes are the receiver's to wipe.
    case capturedPassword([UInt8])
    /// The person pressed Enter at the prompt with nothing typed: they want the phone. Answered
    /// with the push (or key login, escrow capture) that waits there, at once; with the push of
    /// the phone whose proximity offer is there (asked now), within `timeoutMilliseconds`; else
    /// at once with `.noPush(.nothingYet)`.
    case intent
    /// `pam_sm_open_session`: the logind session pam_systemd put in the PAM environment, and
    /// the ticket of the push that authenticated it (empty when no push did).
    case openSession(user: String, sessionID: String, service: String, ticket: String)
    case closeSession(sessionID: String)

    public struct WaitRequest: Equatable, Sendable {
        public var service: String
        public var tty: String
        public var display: String
        /// PAM_RHOST: any value but a loopback name means remote; loopback only with a local
        /// logind session.
        public var remoteHost: String
        /// Empty when any user may log in (a greeter); the locked user for a screen locker.
        public var expectedUser: String
        /// After Enter at a proximity offer, the longest wait for that phone's push.
        public var timeoutMilliseconds: UInt32
        public init(service: String, tty: String, display: String, remoteHost: String = "", expectedUser: String, timeoutMilliseconds: UInt32) {
            self.service = service
            self.tty = tty
            self.display = display
            self.remoteHost = remoteHost
            self.expectedUser = expectedUser
            self.timeoutMilliseconds = timeoutMilliseconds
        }
    }

    /// What the stack decided about a push. `acceptedOther`: the stack succeeded, but the
    /// password it verified is not the one pushed (someone typed one at the keyboard): the
    /// phone gets no credit, no enrolment and no presence link.
    public enum Verdict: UInt8, Sendable { case rejected = 0, accepted = 1, acceptedOther = 2 }

    enum Kind: UInt8 {
        case waitForPush = 0x02, cancel = 0x03, reportOutcome = 0x04, capturedPassword = 0x07, intent = 0x08
        case openSession = 0x05, closeSession = 0x06
    }

    /// For logs and errors: a PAM request's name, from its type byte (nil: not one).
    public static func name(ofType type: UInt8) -> String? { Kind(rawValue: type).map { "\($0)" } }

    public func encode() -> [UInt8] {
        var w = WireWriter()
        switch self {
        case .waitForPush(let r):
            w.kind(Kind.waitForPush.rawValue)
            w.text(r.service); w.text(r.tty); w.text(r.display); w.text(r.remoteHost); w.text(r.expectedUser); w.u32(r.timeoutMilliseconds)
        case .cancel: w.kind(Kind.cancel.rawValue)
        case .capturedPassword(let password): w.kind(Kind.capturedPassword.rawValue); w.secret(password)
        case .intent: w.kind(Kind.intent.rawValue)
        case .reportOutcome(let verdict, let reason):
            w.kind(Kind.reportOutcome.rawValue); w.u8(verdict.rawValue); w.text(reason)
        case .openSession(let user, let session, let service, let ticket):
            w.kind(Kind.openSession.rawValue); w.text(user); w.text(session); w.text(service); w.text(ticket)
        case .closeSession(let session): w.kind(Kind.closeSession.rawValue); w.text(session)
        }
        return w.frame()
    }

    /// Decodes one frame body (without the 2-byte length).
    public static func decode(_ body: [UInt8]) throws(PAMWire.DecodeError) -> PAMRequest {
        var r = try WireReader(body)
        guard let kind = Kind(rawValue: r.kind) else { throw .unknownType(r.kind) }
        let request: PAMRequest
        switch kind {
        case .waitForPush:
            request = .waitForPush(WaitRequest(service: try r.text(), tty: try r.text(), display: try r.text(), remoteHost: try r.text(),
                                               expectedUser: try r.text(), timeoutMilliseconds: try r.u32()))
        case .cancel: request = .cancel
        case .intent: request = .intent
        case .capturedPassword:
            let password = try r.secret()
            guard !password.isEmpty, !password.contains(0) else { throw .invalidText }
            request = .capturedPassword(password)
        case .reportOutcome:
            let v = try r.u8()
            guard let verdict = Verdict(rawValue: v) else { throw .invalidValue(v) }
            request = .reportOutcome(verdict, reason: try r.text())
        case .openSession: request = .openSession(user: try r.text(), sessionID: try r.text(), service: try r.text(), ticket: try r.text())
        case .closeSession: request = .closeSession(sessionID: try r.text())
        }
        try r.end()
        return request
    }
}

/// Daemon to module.
public enum PAMReply: Equatable, Sendable {
    /// Phone login is offered at this prompt: what to show (box ID, the box key's full
    /// fingerprint, and the live pairing code with its seconds left, empty if none).
    case prompt(boxID: String, fingerprint: String, pairingCode: String, codeSeconds: UInt32)
    /// Phone login is not offered here (service not configured, not a local session, ...):
    /// the module steps aside at once and says nothing to the user.
    case notOffered(String)
    /// A phone pushed credentials. The password bytes are the caller's to wipe. `ticket`
    /// names this push when the session opens (`openSession`).
    case push(user: String, password: [UInt8], ticket: String)
    /// Key mode: an enrolled phone asked to log `user` in on its key alone, and this service
    /// takes key logins. Only a module line with the `key` option returns success for it.
    case keyLogin(user: String, ticket: String)
    /// Escrow mode: `user`'s enrolled phone is here and the box has no sealed copy of the
    /// password yet. The module asks the person for it; once the stack accepted it the module
    /// sends it back (`capturedPassword`) for the box to seal under the phone's secret.
    case escrowCapture(user: String, ticket: String)
    /// No push for this Enter: `nothingYet` (no phone has pushed to this prompt), `timedOut`
    /// (the offering phone did not push in time), `superseded` (another prompt on the same
    /// terminal took over), `shuttingDown`.
    case noPush(NoPushReason)
    /// `noPush(.nothingYet)`, and the pairing code the prompt showed is used up or expired:
    /// a new one to show, valid `codeSeconds`.
    case nothingYetNewCode(pairingCode: String, codeSeconds: UInt32)
    case ok
    case error(String)

    public enum NoPushReason: UInt8, Sendable { case timedOut = 0, superseded = 1, shuttingDown = 2, nothingYet = 3 }

    /// The user a push, key login or capture names.
    public var pushedUser: String? {
        switch self {
        case .push(let user, _, _), .keyLogin(let user, _), .escrowCapture(let user, _): user
        default: nil
        }
    }

    /// 0x86 was admin output, now the admin socket's (`AdminReply`).
    enum Kind: UInt8 { case prompt = 0x81, push = 0x82, noPush = 0x83, ok = 0x84, error = 0x85, notOffered = 0x87, keyLogin = 0x88, escrowCapture = 0x89, nothingYetNewCode = 0x8A }

    public func encode() -> [UInt8] {
        var w = WireWriter()
        switch self {
        case .prompt(let id, let fp, let code, let seconds): w.kind(Kind.prompt.rawValue); w.text(id); w.text(fp); w.text(code); w.u32(seconds)
        case .notOffered(let why): w.kind(Kind.notOffered.rawValue); w.text(why)
        case .push(let user, let password, let ticket): w.kind(Kind.push.rawValue); w.text(user); w.secret(password); w.text(ticket)
        case .keyLogin(let user, let ticket): w.kind(Kind.keyLogin.rawValue); w.text(user); w.text(ticket)
        case .escrowCapture(let user, let ticket): w.kind(Kind.escrowCapture.rawValue); w.text(user); w.text(ticket)
        case .noPush(let reason): w.kind(Kind.noPush.rawValue); w.u8(reason.rawValue)
        case .nothingYetNewCode(let code, let seconds): w.kind(Kind.nothingYetNewCode.rawValue); w.text(code); w.u32(seconds)
        case .ok: w.kind(Kind.ok.rawValue)
        case .error(let m): w.kind(Kind.error.rawValue); w.text(m)
        }
        return w.frame()
    }

    /// The length of a push frame, length prefix included.
    public static func pushFrameLength(user: String, passwordLength: Int, ticket: String) -> Int {
        2 + 2 + (1 + min(user.utf8.count, 255)) + (2 + passwordLength) + (1 + min(ticket.utf8.count, 255))
    }

    /// Writes a push frame straight into `out` (exactly `pushFrameLength` bytes), taking the
    /// password from the caller's memory: the daemon keeps it in secure memory up to the
    /// socket buffer, and wipes that buffer after the write.
    public static func writePushFrame(user: String, password: UnsafeRawBufferPointer, ticket: String, into out: UnsafeMutableRawBufferPointer) {
        var head = WireWriter()
        head.kind(Kind.push.rawValue); head.text(user)
        head.bytes += [UInt8(password.count >> 8), UInt8(password.count & 0xff)]
        var tail = WireWriter(); tail.bytes = []; tail.text(ticket)
        let body = head.bytes.count + password.count + tail.bytes.count
        precondition(out.count == 2 + body)
        out[0] = UInt8(body >> 8); out[1] = UInt8(body & 0xff)
        var i = 2
        for b in head.bytes { out[i] = b; i += 1 }
        for b in password { out[i] = b; i += 1 }
        for b in tail.bytes { out[i] = b; i += 1 }
    }

    public static func decode(_ body: [UInt8]) throws(PAMWire.DecodeError) -> PAMReply {
        var r = try WireReader(body)
        guard let kind = Kind(rawValue: r.kind) else { throw .unknownType(r.kind) }
        let reply: PAMReply
        switch kind {
        case .prompt: reply = .prompt(boxID: try r.text(), fingerprint: try r.text(), pairingCode: try r.text(), codeSeconds: try r.u32())
        case .notOffered: reply = .notOffered(try r.text())
        case .push:
            let user = try r.text()
            let password = try r.secret()
            guard !user.isEmpty, !password.isEmpty, !password.contains(0) else { throw .invalidText }
            reply = .push(user: user, password: password, ticket: try r.text())
        case .keyLogin:
            let user = try r.text()
            guard !user.isEmpty else { throw .invalidText }
            reply = .keyLogin(user: user, ticket: try r.text())
        case .escrowCapture:
            let user = try r.text()
            guard !user.isEmpty else { throw .invalidText }
            reply = .escrowCapture(user: user, ticket: try r.text())
        case .noPush:
            let v = try r.u8()
            guard let reason = NoPushReason(rawValue: v) else { throw .invalidValue(v) }
            reply = .noPush(reason)
        case .nothingYetNewCode:
            let code = try r.text()
            guard !code.isEmpty else { throw .invalidText }
            reply = .nothingYetNewCode(pairingCode: code, codeSeconds: try r.u32())
        case .ok: reply = .ok
        case .error: reply = .error(try r.text())
        }
        try r.end()
        return reply
    }
}

struct WireWriter {
    var bytes: [UInt8] = [PAMWire.version]
    mutating func kind(_ k: UInt8) { bytes.append(k) }
    mutating func u8(_ v: UInt8) { bytes.append(v) }
    mutating func u32(_ v: UInt32) { for s in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: v >> UInt32(s))) } }
    /// At most 255 bytes of whole characters, control characters (which every decoder refuses)
    /// as spaces: an error that quotes a file or an error's own words still arrives.
    mutating func text(_ s: String) {
        var u: [UInt8] = []
        for scalar in s.unicodeScalars {
            let control = scalar.value < 0x20 || (0x7f...0x9f).contains(scalar.value)
            let encoded = Array(String(Character(control ? " " : scalar)).utf8)
            guard u.count + encoded.count <= 255 else { break }
            u += encoded
        }
        bytes.append(UInt8(u.count)); bytes += u
    }
    mutating func longText(_ s: String) {
        let u = Array(s.utf8.prefix(PAMWire.maxFrameLength - 4))
        bytes += [UInt8(u.count >> 8), UInt8(u.count & 0xff)]; bytes += u
    }
    mutating func secret(_ s: [UInt8]) {
        bytes += [UInt8(s.count >> 8), UInt8(s.count & 0xff)]; bytes += s
    }
    /// The bytes with the 2-byte length in front.
    func frame() -> [UInt8] { [UInt8(bytes.count >> 8), UInt8(bytes.count & 0xff)] + bytes }
}

struct WireReader {
    let bytes: [UInt8]
    var offset = 2
    let kind: UInt8

    init(_ body: [UInt8]) throws(PAMWire.DecodeError) {
        guard body.count <= PAMWire.maxFrameLength else { throw .tooLong(body.count) }
        guard body.count >= 2 else { throw .truncated }
        guard body[0] == PAMWire.version else { throw .unsupportedVersion(body[0]) }
        bytes = body
        kind = body[1]
    }

    mutating func u8() throws(PAMWire.DecodeError) -> UInt8 {
        guard offset < bytes.count else { throw .truncated }
        defer { offset += 1 }
        return bytes[offset]
    }
    mutating func u32() throws(PAMWire.DecodeError) -> UInt32 {
        var v: UInt32 = 0
        for _ in 0..<4 { v = v << 8 | UInt32(try u8()) }
        return v
    }
    mutating func take(_ n: Int) throws(PAMWire.DecodeError) -> [UInt8] {
        guard n <= bytes.count - offset else { throw .truncated }
        defer { offset += n }
        return Array(bytes[offset..<offset + n])
    }
    mutating func text() throws(PAMWire.DecodeError) -> String {
        let raw = try take(Int(try u8()))
        // No control characters, C0, DEL or C1 (U+009B is a terminal's CSI): they could rewrite what a prompt shows.
        guard let s = String(validating: raw, as: UTF8.self), !s.unicodeScalars.contains(where: { $0.value < 0x20 || (0x7f...0x9f).contains($0.value) }) else { throw .invalidText }
        return s
    }
    mutating func longText() throws(PAMWire.DecodeError) -> String {
        let n = Int(try u8()) << 8 | Int(try u8())
        guard let s = String(validating: try take(n), as: UTF8.self) else { throw .invalidText }
        return s
    }
    mutating func secret() throws(PAMWire.DecodeError) -> [UInt8] {
        let n = Int(try u8()) << 8 | Int(try u8())
        guard n <= 512 else { throw .tooLong(n) }
        return try take(n)
    }
    func end() throws(PAMWire.DecodeError) {
        guard offset == bytes.count else { throw .trailingBytes }
    }
}

/// The daemon's per-connection rules (after OpenSSH's monitor): which request is legal in
/// which state. Anything else closes the connection.
public enum PAMConnectionState: Equatable, Sendable {
    case fresh
    case waiting
    case pushed
    case done

    public func next(on request: PAMRequest) -> PAMConnectionState? {
        switch (self, request) {
        case (.fresh, .waitForPush): return .waiting
        case (.waiting, .cancel): return .done
        case (.waiting, .intent): return .waiting
        case (.pushed, .reportOutcome): return .done
        case (.pushed, .capturedPassword): return .pushed
        case (.pushed, .cancel): return .done
        case (.fresh, .openSession), (.fresh, .closeSession): return .done
        default: return nil
        }
    }
}
