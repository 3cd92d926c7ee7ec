import BoxkeyCore
/// Every way a phone command can end, one exit code each, so scripts can act on them. The
/// agent sends these across its socket; `boxkey` exits with them. The table is in `boxkey
/// --help` and boxkey(1); change both together.
public enum Outcome: Int32, Sendable, CaseIterable, Codable {
    case success = 0
    case failure = 1
    case rejected = 2
    case notFound = 3
    case notPaired = 4
    case wrongPIN = 5
    case radioUnavailable = 6
    case keyChanged = 7
    case notAtPrompt = 8
    case refused = 9
    case pairingFailed = 10
    case noCredentials = 11
    case vaultLockedOut = 12
    case vaultWiped = 13
    case vaultUnusable = 14
    case noSession = 15
    case cancelled = 16
    case timedOut = 17
    case agentUnavailable = 18
    case notLockable = 19
    /// Bad arguments: the argument parser's own code (EX_USAGE).
    case usage = 64

    public var summary: String {
        switch self {
        case .success: "success"
        case .failure: "other error (I/O, an unexpected answer)"
        case .rejected: "the box's PAM stack rejected the password"
        case .notFound: "box not found nearby"
        case .notPaired: "box not paired, or no default box"
        case .wrongPIN: "wrong PIN (the attempt was counted)"
        case .radioUnavailable: "radio unavailable"
        case .keyChanged: "the box presents another key than the one paired"
        case .notAtPrompt: "the box is not at a login prompt, or at more than one"
        case .refused: "refused by the box (not enrolled, revoked, rate limited, no pairing code, other version)"
        case .pairingFailed: "pairing failed (wrong code)"
        case .noCredentials: "no credentials stored"
        case .vaultLockedOut: "too many wrong PINs: wait until the time given"
        case .vaultWiped: "the credentials were wiped after 10 wrong PINs"
        case .vaultUnusable: "the vault is tampered or unreadable, or the PIN attempt could not be recorded: nothing was tried"
        case .noSession: "no session of yours on the box"
        case .cancelled: "cancelled: a question declined, or nothing entered (no attempt)"
        case .timedOut: "the box did not answer in time"
        case .agentUnavailable: "no agent running"
        case .notLockable: "the box cannot lock the session (a text console): it is still open"
        case .usage: "bad arguments"
        }
    }
}

/// A phone command's failure: its outcome and what to tell the person.
public struct PhoneFailure: Error, CustomStringConvertible, Sendable {
    public let outcome: Outcome
    public let message: String
    /// The box's refusal, when it refused the link.
    public let refusal: Refusal.Code?
    public init(_ outcome: Outcome, _ message: String, refusal: Refusal.Code? = nil) {
        self.outcome = outcome
        self.message = message
        self.refusal = refusal
    }
    public var description: String { message }
}

extension Vault.Failure {
    /// The outcome a vault failure ends a command with.
    public var outcome: Outcome {
        switch self {
        case .noCredentials: .noCredentials
        case .pinRequired, .noPINEntered, .notAPIN: .cancelled
        case .wrongPIN: .wrongPIN
        case .lockedOut: .vaultLockedOut
        case .wiped: .vaultWiped
        case .tampered, .attemptNotRecorded: .vaultUnusable
        }
    }

    public var asPhoneFailure: PhoneFailure { PhoneFailure(outcome, description) }
}
