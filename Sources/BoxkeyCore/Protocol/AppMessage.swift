/// Application messages: the plaintext of one sealed envelope.
///
///     0     type
///     1...  body, laid out per type (docs/protocol.md, "Application messages")
///
/// Decoders are exact: each field's length is checked against its limit and the message must
/// end exactly where the last field ends. Anything else is `AppMessage.DecodeError`.
public enum AppMessage: Sendable {
    case credentialPush(CredentialPush)   // phone -> box
    case loginResult(LoginResult)         // box -> phone
    case lock                             // phone -> box
    case logout                           // phone -> box
    case attach                           // phone -> box: become the presence link of my session
    case actionResult(ActionResult)       // box -> phone, answers lock / logout / attach
    case keepalive                        // both ways, on the presence link
    case error(ChannelError)              // both ways
    case detach                           // phone -> box: I leave on purpose; this is not walking away
    case pair                             // phone -> box, after a pairing handshake: enrol this key
    case offer(ProximityOffer)            // phone -> box: near, and ready to log `user` in once the person says so
    case intent                           // box -> phone: the person asked at the box (Enter): push now
    case awaitingEnter(EnterWait)         // box -> phone: the push waits at a prompt for Enter there
    case withdraw                         // phone -> box: take my push back (not used until Enter)

    public enum MessageType: UInt8, Sendable, CaseIterable {
        case credentialPush = 0x01
        case loginResult = 0x02
        case lock = 0x03
        case logout = 0x04
        case attach = 0x05
        case actionResult = 0x06
        case keepalive = 0x07
        case error = 0x08
        case detach = 0x09
        case pair = 0x0a
        case offer = 0x0b
        case intent = 0x0c
        case awaitingEnter = 0x0d
        case withdraw = 0x0e
    }

    public enum DecodeError: Error, Equatable, Sendable {
        case empty
        case unknownType(UInt8)
        case truncated(MessageType)
        case trailingBytes(MessageType)
        case fieldTooLong(field: String, length: Int, limit: Int)
        case fieldEmpty(field: String)
        case invalidText(field: String)
        case unknownValue(field: String, value: UInt8)
    }

    public var type: MessageType {
        switch self {
        case .credentialPush: .credentialPush
        case .loginResult: .loginResult
        case .lock: .lock
        case .logout: .logout
        case .attach: .attach
        case .actionResult: .actionResult
        case .keepalive: .keepalive
        case .error: .error
        case .detach: .detach
        case .pair: .pair
        case .offer: .offer
        case .intent: .intent
        case .awaitingEnter: .awaitingEnter
        case .withdraw: .withdraw
        }
    }

    /// Encodes into secure memory: a credential push holds a password.
    public func encode() -> SecureBytes {
        var writer = ByteWriter()
        writer.u8(type.rawValue)
        switch self {
        case .credentialPush(let push):
            writer.shortText(push.user)
            let passwordLength = push.password.count
            writer.u8(UInt8(passwordLength >> 8)); writer.u8(UInt8(passwordLength & 0xff))
            let prefix = writer.bytes
            let suffixWriter: ByteWriter = { var w = ByteWriter(); w.shortText(push.deviceName); return w }()
            let out = SecureBytes(count: prefix.count + passwordLength + suffixWriter.bytes.count)
            out.withUnsafeMutableBytes { o in
                o.copyBytes(from: prefix)
                push.password.withUnsafeBytes { p in
                    UnsafeMutableRawBufferPointer(rebasing: o[prefix.count..<prefix.count + passwordLength]).copyMemory(from: p)
                }
                UnsafeMutableRawBufferPointer(rebasing: o[(prefix.count + passwordLength)...]).copyBytes(from: suffixWriter.bytes)
            }
            return out
        case .loginResult(let result):
            writer.u8(result.outcome.rawValue)
            writer.shortText(result.reason)
        case .actionResult(let result):
            writer.u8(result.action.rawValue)
            writer.u8(result.outcome.rawValue)
        case .error(let error):
            writer.u8(error.code.rawValue)
            writer.shortText(error.detail)
        case .offer(let offer):
            writer.shortText(offer.user)
            writer.shortText(offer.deviceName)
        case .awaitingEnter(let wait):
            writer.u8(UInt8(wait.seconds >> 8)); writer.u8(UInt8(wait.seconds & 0xff))
            writer.shortText(wait.place)
        case .lock, .logout, .attach, .keepalive, .detach, .pair, .intent, .withdraw:
            break
        }
        return SecureBytes(copying: writer.bytes)
    }

    public static func decode(_ plaintext: SecureBytes) throws(DecodeError) -> AppMessage {
        try plaintext.withUnsafeBytes { (bytes) throws(DecodeError) -> AppMessage in try decode(bytes) }
    }

    public static func decode(_ bytes: UnsafeRawBufferPointer) throws(DecodeError) -> AppMessage {
        guard let first = bytes.first else { throw .empty }
        guard let type = MessageType(rawValue: first) else { throw .unknownType(first) }
        var reader = ByteReader(bytes: bytes, type: type)
        _ = try reader.u8()
        let message: AppMessage
        switch type {
        case .credentialPush:
            let user = try reader.shortText(field: "user", limit: CredentialPush.maxUserLength)
            guard !user.isEmpty else { throw .fieldEmpty(field: "user") }
            let passwordLength = Int(try reader.u8()) << 8 | Int(try reader.u8())
            // 0: a key login (the phone holds no password; `CredentialPush.isKeyLogin`).
            guard passwordLength <= CredentialPush.maxPasswordLength else {
                throw .fieldTooLong(field: "password", length: passwordLength, limit: CredentialPush.maxPasswordLength)
            }
            let password = try reader.secret(count: passwordLength)
            // PAM hands the password on as a C string: an embedded NUL would silently truncate it.
            // The one exception is the escrow form, which starts with NUL and never reaches PAM.
            let hasNUL = password.withUnsafeBytes { $0.contains(0) }
            guard !hasNUL || CredentialPush.isEscrowForm(password) else { throw .invalidText(field: "password") }
            let name = try reader.shortText(field: "deviceName", limit: CredentialPush.maxDeviceNameLength)
            message = .credentialPush(CredentialPush(user: user, password: password, deviceName: name))
        case .loginResult:
            let raw = try reader.u8()
            guard let outcome = LoginResult.Outcome(rawValue: raw) else { throw .unknownValue(field: "outcome", value: raw) }
            let reason = try reader.shortText(field: "reason", limit: LoginResult.maxReasonLength)
            message = .loginResult(LoginResult(outcome, reason: reason))
        case .actionResult:
            let a = try reader.u8()
            guard let action = ActionResult.Action(rawValue: a) else { throw .unknownValue(field: "action", value: a) }
            let o = try reader.u8()
            guard let outcome = ActionResult.Outcome(rawValue: o) else { throw .unknownValue(field: "outcome", value: o) }
            message = .actionResult(ActionResult(action: action, outcome: outcome))
        case .error:
            let c = try reader.u8()
            guard let code = ChannelError.Code(rawValue: c) else { throw .unknownValue(field: "code", value: c) }
            let detail = try reader.shortText(field: "detail", limit: ChannelError.maxDetailLength)
            message = .error(ChannelError(code, detail: detail))
        case .lock: message = .lock
        case .logout: message = .logout
        case .attach: message = .attach
        case .keepalive: message = .keepalive
        case .detach: message = .detach
        case .pair: message = .pair
        case .intent: message = .intent
        case .withdraw: message = .withdraw
        case .offer:
            let user = try reader.shortText(field: "user", limit: CredentialPush.maxUserLength)
            guard !user.isEmpty else { throw .fieldEmpty(field: "user") }
            let name = try reader.shortText(field: "deviceName", limit: CredentialPush.maxDeviceNameLength)
            message = .offer(ProximityOffer(user: user, deviceName: name))
        case .awaitingEnter:
            let seconds = UInt16(try reader.u8()) << 8 | UInt16(try reader.u8())
            let place = try reader.shortText(field: "place", limit: EnterWait.maxPlaceLength)
            message = .awaitingEnter(EnterWait(seconds: seconds, place: place))
        }
        guard reader.atEnd else { throw .trailingBytes(type) }
        return message
    }
}

/// Proximity login: the phone is near a box whose prompt waits, and will push `user`'s
/// credentials once the person asks for it at the box (`intent`). No secret in it.
///
///     0        user length U (1..128), then the user
///     +1       device name length N (0..32), then the name
public struct ProximityOffer: Sendable, Equatable {
    public let user: String
    public let deviceName: String
    public init(user: String, deviceName: String) {
        self.user = user
        self.deviceName = deviceName
    }
}

/// The box holds a push at the prompt it went to until someone presses Enter there, for at
/// most `seconds`: a login program's conversation cannot take it while its password prompt is
/// on the screen (docs/login-programs.md).
///
///     0        seconds (BE, 2 bytes)
///     +2       place length (0..128), then the place ("login on tty1")
public struct EnterWait: Sendable, Equatable {
    public static let maxPlaceLength = 128
    public let seconds: UInt16
    public let place: String
    public init(seconds: UInt16, place: String) {
        self.seconds = seconds
        self.place = String(place.utf8.count <= Self.maxPlaceLength ? place : String(decoding: place.utf8.prefix(Self.maxPlaceLength), as: UTF8.self))
    }
}

/// User name and password, pushed once per handshake.
///
///     0        user length U (1..128)
///     1..U     user, UTF-8, no control characters
///     +2       password length P (BE, 1..512; PAM_MAX_RESP_SIZE is 512)
///     +P       password, bytes, no NUL
///     +1       device name length N (0..32)
///     +N       device name, UTF-8 (shown in the box's audit log and phone list)
public struct CredentialPush: Sendable, CustomStringConvertible {
    public static let maxUserLength = 128
    public static let maxPasswordLength = 512
    public static let maxDeviceNameLength = 32
    /// type + user length + user + password length + password + name length + name.
    public static let maxEncodedLength = 1 + 1 + maxUserLength + 2 + maxPasswordLength + 1 + maxDeviceNameLength

    public let user: String
    /// Empty for a key login: the phone asks to be let in on its enrolled key and the person's
    /// intent alone, which a box takes only in key mode (docs/login-modes.md).
    public let password: SecureBytes
    public let deviceName: String

    public var isKeyLogin: Bool { password.count == 0 }

    /// What the password field carries: a password (no NUL), nothing (a key login), or, in
    /// escrow mode, NUL then the phone's 32-byte escrow secret, which opens the password the box
    /// keeps sealed for this phone (docs/login-modes.md).
    public enum Kind: String, Equatable, Sendable { case password, key, escrow }
    public static let escrowSecretLength = 32

    public var kind: Kind { isKeyLogin ? .key : Self.isEscrowForm(password) ? .escrow : .password }

    /// The escrow secret of an escrow push.
    public var escrowSecret: SecureBytes? { Self.escrowSecret(in: password) }

    /// The secret in a field of the escrow form (what the phone's vault stores), else nil.
    public static func escrowSecret(in field: SecureBytes) -> SecureBytes? {
        guard isEscrowForm(field) else { return nil }
        return field.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[1...])) }
    }

    /// The password field of an escrow push: NUL, then the secret.
    public static func escrowField(_ secret: SecureBytes) -> SecureBytes {
        SecureBytes(count: 1 + secret.count) { (o: UnsafeMutableRawBufferPointer) in
            o[0] = 0
            secret.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: o[1...]).copyMemory(from: $0) }
        }
    }

    static func isEscrowForm(_ field: SecureBytes) -> Bool {
        field.count == 1 + escrowSecretLength && field.withUnsafeBytes { $0[0] == 0 }
    }

    public init(user: String, password: SecureBytes, deviceName: String) {
        self.user = user
        self.password = password
        self.deviceName = deviceName
    }

    /// Checks limits before sending, with the same rules the decoder applies.
    public func validate() throws(AppMessage.DecodeError) {
        guard !user.isEmpty else { throw .fieldEmpty(field: "user") }
        guard user.utf8.count <= Self.maxUserLength else { throw .fieldTooLong(field: "user", length: user.utf8.count, limit: Self.maxUserLength) }
        guard isPrintable(user) else { throw .invalidText(field: "user") }
        guard password.count <= Self.maxPasswordLength else { throw .fieldTooLong(field: "password", length: password.count, limit: Self.maxPasswordLength) }
        guard !password.withUnsafeBytes({ $0.contains(0) }) || Self.isEscrowForm(password) else { throw .invalidText(field: "password") }
        guard deviceName.utf8.count <= Self.maxDeviceNameLength else { throw .fieldTooLong(field: "deviceName", length: deviceName.utf8.count, limit: Self.maxDeviceNameLength) }
        guard isPrintable(deviceName) else { throw .invalidText(field: "deviceName") }
    }

    public var description: String { "CredentialPush(user: \(user), password: redacted, device: \(deviceName))" }
}

/// The box's answer to a credential push.
public struct LoginResult: Equatable, Sendable {
    public static let maxReasonLength = 128

    public enum Outcome: UInt8, Sendable {
        /// The PAM stack accepted the credentials; the session is open or unlocked.
        case accepted = 0
        /// The site's verifier rejected them (wrong password, expired account, ...).
        case rejected = 1
        /// No login prompt is waiting on the box; the push was discarded, not stored.
        case notAtPrompt = 2
        /// The prompt waits for another user (a locked session of someone else).
        case wrongUser = 3
        /// The PAM stack did not report an outcome in time.
        case timedOut = 4
        /// More than one prompt could take the push; the box does not guess (the reason
        /// names them).
        case ambiguousPrompt = 5
        /// The phone took its push back (`withdraw`) before Enter was pressed: nothing of it
        /// reached the prompt. (Version 5.)
        case withdrawn = 6
    }

    public var outcome: Outcome
    /// Human-readable, for the phone to show. Never contains the password.
    public var reason: String

    public init(_ outcome: Outcome, reason: String = "") {
        self.outcome = outcome
        self.reason = reason
    }
}

/// The box's answer to lock, logout and attach.
public struct ActionResult: Equatable, Sendable {
    public enum Action: UInt8, Sendable { case lock = 1, logout = 2, attach = 3, pair = 4 }
    public enum Outcome: UInt8, Sendable {
        case done = 0
        /// This phone has no live session on the box.
        case noSession = 1
        /// logind refused or failed.
        case failed = 2
        /// A lock logind carried out, but no session said it was locked (LockedHint) within
        /// the box's `lock_confirm_s`: nothing on it follows logind's Lock (a text console,
        /// a desktop without a logind-aware locker). The session is still open. (Version 5.)
        case notLockable = 3
    }
    public var action: Action
    public var outcome: Outcome
    public init(action: Action, outcome: Outcome) {
        self.action = action
        self.outcome = outcome
    }
}

/// An error inside the channel; after sending or receiving one the channel closes.
public struct ChannelError: Equatable, Sendable, Error {
    public static let maxDetailLength = 128
    public enum Code: UInt8, Sendable {
        /// The message is not legal in the receiver's current state.
        case unexpectedMessage = 1
        /// The message did not decode.
        case malformed = 2
        /// Too many rejected pushes from this phone; try later.
        case rateLimited = 3
        /// The box could not process the request (for example its PAM bridge failed).
        case internalError = 4
    }
    public var code: Code
    public var detail: String
    public init(_ code: Code, detail: String = "") {
        self.code = code
        self.detail = detail
    }
}

extension AppMessage: Equatable {
    public static func == (a: AppMessage, b: AppMessage) -> Bool {
        switch (a, b) {
        case let (.credentialPush(x), .credentialPush(y)):
            return x.user == y.user && x.deviceName == y.deviceName && x.password.isEqual(to: y.password)
        case let (.loginResult(x), .loginResult(y)): return x == y
        case let (.actionResult(x), .actionResult(y)): return x == y
        case let (.awaitingEnter(x), .awaitingEnter(y)): return x == y
        case let (.error(x), .error(y)): return x == y
        case let (.offer(x), .offer(y)): return x == y
        case (.lock, .lock), (.logout, .logout), (.attach, .attach), (.keepalive, .keepalive), (.detach, .detach),
             (.pair, .pair), (.intent, .intent), (.withdraw, .withdraw): return true
        default: return false
        }
    }
}

extension ChannelError.Code: CustomStringConvertible {
    public var description: String {
        switch self {
        case .unexpectedMessage: "a message out of turn"
        case .malformed: "a message that did not decode"
        case .rateLimited: "too many rejected pushes"
        case .internalError: "an error inside the box"
        }
    }
}
