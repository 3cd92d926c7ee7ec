import BoxkeyCore
import BoxkeyPAMWire
import NIOConcurrencyHelpers

/// What Enter at an open prompt receives: the push (password still in secure memory, for the
/// PAM bridge to write straight into the socket buffer), or why none came.
public enum PromptAnswer: Sendable {
    case push(user: String, password: SecureBytes, ticket: String)
    /// Key mode: no password; the module's `key` line decides.
    case keyLogin(user: String, ticket: String)
    /// Escrow mode, no sealed copy yet: the module asks the person for the password, and sends
    /// it once the stack accepted it.
    case escrowCapture(user: String, ticket: String)
    case noPush(PAMReply.NoPushReason)
    /// No push yet, and the pairing code the prompt showed is used up or expired: this one
    /// replaces it (the module says it with "No phone has pushed").
    case nothingYetNewCode(code: String, seconds: UInt32)

    /// The pushed user, if a push came.
    public var pushedUser: String? {
        switch self {
        case .push(let user, _, _), .keyLogin(let user, _), .escrowCapture(let user, _): user
        case .noPush, .nothingYetNewCode: nil
        }
    }
}

/// One Enter's wait for a push: answered once, by the box or by the task's cancellation,
/// whichever comes first (a cancellation may come before the wait has begun).
final class PromptWaiter: Sendable {
    private enum Slot {
        case empty
        case waiting(CheckedContinuation<PromptAnswer, Never>)
        case answered
    }
    private let slot = NIOLockedValueBox(Slot.empty)

    /// False when already answered (cancelled): the caller answers `c` itself.
    func wait(_ c: CheckedContinuation<PromptAnswer, Never>) -> Bool {
        slot.withLockedValue { slot in
            guard case .empty = slot else { return false }
            slot = .waiting(c)
            return true
        }
    }

    func resume(returning answer: PromptAnswer) {
        let waiting: CheckedContinuation<PromptAnswer, Never>? = slot.withLockedValue { slot in
            defer { slot = .answered }
            if case .waiting(let c) = slot { return c }
            return nil
        }
        waiting?.resume(returning: answer)
    }
}

/// Who is on the other end of a PAM socket connection, from SO_PEERCRED.
public struct PAMPeer: Sendable {
    public var pid: Int32
    public var uid: UInt32
    public init(pid: Int32, uid: UInt32) { self.pid = pid; self.uid = uid }
}
