import BoxkeyCore
import BoxkeyRadio
import NIOConcurrencyHelpers

/// What a login achieved, for the person and for the bench.
public struct LoginReport: Sendable, Codable {
    public var box: String
    public var user: String
    /// Where the session is, as the box said ("gdm-password on seat0").
    public var place: String
    /// From the start of the search to the box's answer.
    public var radioMilliseconds: Int
    /// Simulated radio only: connection events, ATT value bytes, link-layer packets.
    public var airEvents: Int?
    public var airBytes: Int?
    public var airPackets: Int?
}

extension Phone {
    /// Finds box `id`, pushes the credentials and waits for the PAM stack's answer. Accepted,
    /// the link is returned in the presence state (the caller keeps it or detaches it);
    /// otherwise it is closed and the outcome thrown.
    ///
    /// `offerFirst` (proximity): offer the login and push only once the person pressed Enter at
    /// the box's prompt, within `intentWait`.
    ///
    /// `withdrawal`: asked (Ctrl-C, `agent forget`, `lock`) while the push waits for Enter, the
    /// phone takes it back (`withdraw`) and the box answers `withdrawn`.
    public mutating func login(to id: BoxID, user: String, password: SecureBytes, radio: any CentralRadio,
                               offerFirst: Bool = false, intentWait: Duration = .seconds(130),
                               withdrawal: Withdrawal? = nil,
                               progress: (@Sendable (Duration) -> Void)? = nil,
                               awaitingEnter: (@Sendable (EnterWait) -> Void)? = nil) async throws(PhoneFailure) -> (LoginReport, BoxLink) {
        let clock = MonotonicClock()
        var start = clock.now
        let link = try await connect(to: id, radio: radio, progress: progress)
        // Escrow: each box gets only its own secret, derived from the vault's with the key this
        // connection's handshake proved, so no box learns what opens another box's sealed copy.
        var password = password
        if let master = CredentialPush.escrowSecret(in: password) {
            password = CredentialPush.escrowField(EscrowSeal.boxSecret(master: master, boxKey: link.boxKey))
        }
        if offerFirst {
            let heard: PhoneConnection.Event
            do {
                try await link.send(.offer(ProximityOffer(user: user, deviceName: deviceName)))
                heard = try await link.next(timeout: intentWait)
            } catch {
                await link.close()
                throw failure(error, box: id)
            }
            switch heard {
            case .intent:
                start = clock.now  // the login's time runs from the person's Enter
            case .loginResult(let refused):
                await link.close()
                throw PhoneFailure(.notAtPrompt, refused.reason.isEmpty ? tr("box {box} is not at a login prompt", ("box", id)) : Self.saying(refused.reason, box: id))
            default:
                await link.close()
                throw PhoneFailure(.failure, tr("unexpected answer from box {box}", ("box", id)))
            }
        }
        var answer: PhoneConnection.Event
        do {
            guard withdrawal?.pushing() ?? true else {
                await link.close()
                throw PhoneFailure(.cancelled, tr("Cancelled before anything was sent to box {box}.", ("box", id)))
            }
            try await link.send(.credentialPush(CredentialPush(user: user, password: password, deviceName: deviceName)))
            // The program's password prompt is on the box's screen: the push waits there for
            // Enter, at most the seconds the box says (then its answer comes).
            var deadline = clock.now + .seconds(90)
            var withdrawn = false
            while true {
                if !withdrawn, withdrawal?.isAsked == true {
                    try await link.send(.withdraw)
                    withdrawn = true
                    deadline = min(deadline, clock.now + .seconds(10))
                }
                do {
                    // Short reads while a withdrawal may come; one long read otherwise.
                    answer = try await link.next(timeout: withdrawal == nil || withdrawn ? deadline - clock.now : min(.milliseconds(100), deadline - clock.now))
                } catch BoxLink.Failure.timedOut(let what) {
                    guard clock.now < deadline else { throw BoxLink.Failure.timedOut(what) }
                    continue
                }
                guard case .awaitingEnter(let wait) = answer else { break }
                awaitingEnter?(wait)
                deadline = clock.now + .seconds(Int64(wait.seconds) + 90)
            }
        } catch let f as PhoneFailure {
            throw f
        } catch {
            await link.close()
            throw failure(error, box: id)
        }
        guard case .loginResult(let result) = answer else {
            await link.close()
            throw PhoneFailure(.failure, tr("unexpected answer from box {box}", ("box", id)))
        }
        let elapsed = clock.now - start
        switch result.outcome {
        case .accepted:
            let stats = link.airStatistics
            let report = LoginReport(box: id.description, user: user, place: result.reason,
                                     radioMilliseconds: Int(elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000),
                                     airEvents: stats?.events, airBytes: stats?.bytes, airPackets: stats?.packets)
            return (report, link)
        case .rejected:
            await link.close()
            // The advice depends on what was sent: only a password can have changed.
            let advice = switch CredentialPush(user: user, password: password, deviceName: "").kind {
            case .password: tr("If the password changed, run `boxkey credentials set` and log in again.")
            case .key: tr("This phone holds no password (key logins only): box {box} takes key logins only from users its admin put in key mode. To log in here, store the password: boxkey credentials set --user {user}.", ("box", id), ("user", user))
            case .escrow: tr("This phone holds an escrow secret, no password: if box {box} has no sealed copy of your password for it, type the password there once with this phone near.", ("box", id))
            }
            throw PhoneFailure(.rejected, tr("box {box} rejected the login for {user}: {reason}.", ("box", id), ("user", user), ("reason", result.reason)) + " " + advice)
        case .withdrawn:
            await link.close()
            throw PhoneFailure(.cancelled, tr("Withdrawn: box {box} dropped the push before Enter was pressed there; nothing reached its prompt.", ("box", id)))
        case .notAtPrompt, .wrongUser, .ambiguousPrompt:
            await link.close()
            throw PhoneFailure(.notAtPrompt, result.reason.isEmpty ? tr("box {box} is not at a login prompt", ("box", id)) : Self.saying(result.reason, box: id))
        case .timedOut:
            await link.close()
            throw PhoneFailure(.timedOut, Self.saying(result.reason, box: id))
        }
    }

    /// The box's reason, said as coming from box `id`, without naming the box twice ("box
    /// 4821: box 4821 is not at a login prompt").
    static func saying(_ reason: String, box id: BoxID) -> String {
        reason.lowercased().hasPrefix("box \(id)") ? reason : "box \(id): \(reason)"
    }

    /// Locks or ends this phone's session on box `id` over `link` (a new one, or the presence
    /// link), then closes it; `keepOnFailure`: a link the box answered with a failure stays
    /// open (the presence link goes on guarding a session that was not locked).
    public static func act(_ action: ActionResult.Action, on link: BoxLink, box id: BoxID, keepOnFailure: Bool = false) async throws(PhoneFailure) {
        var result: PhoneConnection.Event
        do {
            try await link.send(action == .lock ? .lock : .logout)
            // On a presence link, the answer to a keepalive sent just before may come first.
            // A lock's answer waits on the box's `lock_confirm_s` (up to 60 s).
            let deadline = MonotonicClock().now + (action == .lock ? Self.lockAnswerWait : .seconds(15))
            repeat {
                result = try await link.next(timeout: max(deadline - MonotonicClock().now, .milliseconds(1)))
            } while result == .keepalive
        } catch {
            await link.close()
            throw PhoneFailure(.failure, "box \(id): \(error)")
        }
        guard case .actionResult(let r) = result else {
            await link.close()
            throw PhoneFailure(.failure, tr("unexpected answer from box {box}", ("box", id)))
        }
        if r.outcome == .done || !keepOnFailure { await link.close() }
        switch r.outcome {
        case .done: return
        case .noSession: throw PhoneFailure(.noSession, tr("you have no session on box {box}", ("box", id)))
        case .failed: throw PhoneFailure(.failure, action == .lock ? tr("box {box} could not lock the session", ("box", id)) : tr("box {box} could not end the session", ("box", id)))
        case .notLockable:
            throw PhoneFailure(.notLockable, tr("box {box} cannot lock your session: nothing on it follows logind's Lock (a text console, or a desktop without a screen locker). What did not lock is still open; `boxkey logout` ends it.", ("box", id)))
        }
    }

    /// How long the phone waits for a lock's answer: the box's longest `lock_confirm_s` (60 s)
    /// and logind's own time.
    public static let lockAnswerWait: Duration = .seconds(75)
}

extension EnterWait {
    /// What the phone says while its push waits at the box's prompt.
    public func sentence(box: BoxID) -> String {
        place.isEmpty
            ? tr("Sent. Press Enter at box {box}'s password prompt (within {seconds} s) to log in.", ("box", box), ("seconds", seconds))
            : tr("Sent. Press Enter at box {box}'s password prompt ({place}, within {seconds} s) to log in.", ("box", box), ("place", place), ("seconds", seconds))
    }
}

extension LoginReport {
    /// The line `boxkey login` prints.
    public var sentence: String {
        place.isEmpty
            ? tr("Logged in to box {box} as {user} ({ms} ms).", ("box", box), ("user", user), ("ms", radioMilliseconds))
            : tr("Logged in to box {box} as {user}: {place} ({ms} ms).", ("box", box), ("user", user), ("place", place), ("ms", radioMilliseconds))
    }

    public var airSentence: String? {
        guard let airEvents, let airBytes, let airPackets else { return nil }
        return "Air: \(airEvents) connection events from connect to the answer, \(airPackets) link-layer packets, \(airBytes) ATT value bytes both ways."
    }
}

/// A push the person may take back while it waits for Enter at the box (Ctrl-C in `boxkey
/// login`, `agent forget`, `boxkey lock`, the agent's client gone). Whoever sees the person ask
/// calls `ask`; the login sends `withdraw` at its next read.
public final class Withdrawal: Sendable {
    private let state = NIOLockedValueBox<(asked: Bool, pushed: Bool)>((false, false))

    public init() {}

    /// Asks for the push back; false when none has been sent yet (nothing to take back: the
    /// caller may just stop, and the push never goes).
    @discardableResult
    public func ask() -> Bool {
        state.withLockedValue { s in
            s.asked = true
            return s.pushed
        }
    }

    public var isAsked: Bool { state.withLockedValue { $0.asked } }

    /// The push is about to go: false if the person already asked to stop.
    func pushing() -> Bool {
        state.withLockedValue { s in
            guard !s.asked else { return false }
            s.pushed = true
            return true
        }
    }
}
