import BoxkeyCore
import BoxkeyRadio
import FoundationEssentials
import NIOConcurrencyHelpers

/// The phone's half of the presence link: after an accepted login it keeps the link up with
/// keepalives, finds the box again after a link loss and re-attaches (within the box's grace
/// period that cancels the walk-away action), carries lock and logout asked for meanwhile,
/// and under the simulated radio follows `boxkey sim move`.
public final class PresenceLink: Sendable {
    public enum Ending: Equatable, Sendable {
        /// Asked to leave: walking away (the box acts by its policy), or detached (it does not).
        case left(detached: Bool)
        /// A lock or logout was carried out on this link.
        case acted
        /// The box has no session for this phone any more (locked or ended meanwhile).
        case sessionGone
        /// The channel failed in a way re-attaching cannot mend.
        case failed(String)
        /// The box no longer takes this phone (revoked, or no longer enrolled): said once, and
        /// the link is not looked for again.
        case removed(String)
    }

    public let box: BoxID
    private let phone: Phone
    private let radio: any PhoneRadio
    private let keepalive: Duration
    private let log: @Sendable (String) -> Void
    private let state: NIOLockedValueBox<State>

    private struct State {
        var link: BoxLink
        var leave: Bool?  // detach?
        var actions: [(ActionResult.Action, @Sendable (Result<Void, PhoneFailure>?) -> Void)] = []
        var connected = true
        /// `run` has returned: an action asked for now is answered at once (nil).
        var ended = false
    }

    public init(box: BoxID, link: BoxLink, phone: Phone, radio: any PhoneRadio, keepalive: Duration = BoxkeyProtocol.keepaliveInterval,
                log: @escaping @Sendable (String) -> Void) {
        self.box = box
        self.phone = phone
        self.radio = radio
        self.keepalive = keepalive
        self.log = log
        state = NIOLockedValueBox(State(link: link))
    }

    /// Whether the link is up now (false while looking for the box after a loss).
    public var isConnected: Bool { state.withLockedValue { $0.connected } }

    /// Ends the link: `detach` tells the box this is no walk-away.
    public func leave(detach: Bool) {
        state.withLockedValue { $0.leave = detach }
    }

    /// Carries out a lock or logout on the link; `done` is told how it went, or nil if the link
    /// was lost (or is being found again) before it could act: the caller then uses a new link.
    public func act(_ action: ActionResult.Action, done: @escaping @Sendable (Result<Void, PhoneFailure>?) -> Void) {
        let taken = state.withLockedValue { s -> Bool in
            guard !s.ended else { return false }
            s.actions.append((action, done))
            return true
        }
        if !taken { done(nil) }
    }

    /// Runs until the link ends; returns why.
    public func run() async -> Ending {
        let ending = await runLink()
        // Nothing asked for from now on waits for a link that is gone.
        state.withLockedValue { $0.ended = true }
        failPending()
        return ending
    }

    private func runLink() async -> Ending {
        let clock = MonotonicClock()
        var nextKeepalive = clock.now + keepalive
        while true {
            radio.followMoves(log: log)
            let (link, leave, action) = state.withLockedValue { s in (s.link, s.leave, s.actions.isEmpty ? nil : s.actions.removeFirst()) }
            if let detach = leave {
                if detach { try? await link.send(.detach) }
                await link.close()
                failPending()
                return .left(detached: detach)
            }
            var lost: DisconnectReason?
            if let (what, done) = action {
                do {
                    try await Phone.act(what, on: link, box: box, keepOnFailure: true)
                    done(.success(()))
                    failPending()
                    return .acted
                } catch {
                    // Not locked or ended: the link goes on guarding the session. One lost
                    // meanwhile is found again like any other.
                    done(.failure(error))
                    guard let reason = await link.lostReason else {
                        nextKeepalive = clock.now
                        continue
                    }
                    lost = reason
                }
            }
            do {
                if let lost { throw BoxLink.Failure.linkLost(lost) }
                let event = try await link.next(timeout: .milliseconds(200))
                if case .actionResult = event { await link.close(); return .sessionGone }
            } catch BoxLink.Failure.timedOut {
                if clock.now >= nextKeepalive {
                    try? await link.send(.keepalive)
                    nextKeepalive = clock.now + keepalive
                }
            } catch BoxLink.Failure.linkLost(let reason) {
                state.withLockedValue { $0.connected = false }
                let lostAt = localClockTime(Date())
                log(tr("Presence link to box {box} lost at {time} ({reason}); looking for the box…", ("box", box), ("time", lostAt), ("reason", reason.sentence)))
                switch await reattach() {
                case .back(let newLink):
                    state.withLockedValue { $0.link = newLink; $0.connected = true }
                    nextKeepalive = clock.now + keepalive
                    log(tr("Back in range: presence link to box {box} restored.", ("box", box)))
                case .gone:
                    // The box acted by its walk-away policy after its grace time: it says only
                    // that no session is left for this phone, not whether it locked or ended it.
                    log(tr("Box {box} has no session for this phone any more: it was locked or ended after the presence link was lost at {time} (walking away).", ("box", box), ("time", lostAt)))
                    failPending()
                    return .sessionGone
                case .left(let detached):
                    failPending()
                    return .left(detached: detached)
                case .removed(let why):
                    failPending()
                    return .removed(why)
                }
            } catch {
                await link.close()
                failPending()
                return .failed("\(error)")
            }
        }
    }

    private enum Reattach { case back(BoxLink), gone, left(detached: Bool), removed(String) }

    /// Finds the box again and asks to be its presence link again (`attach`).
    private func reattach() async -> Reattach {
        let central = radio.centralForReattach()
        var phone = phone
        var backOff = BackOff()
        while true {
            radio.followMoves(log: log)
            if let detach = state.withLockedValue({ $0.leave }) { return .left(detached: detach) }
            // No link to act on while looking for the box: whoever asked uses a new one.
            failPending()
            let link: BoxLink
            do { link = try await phone.connect(to: box, radio: central, searchTime: .seconds(1)) } catch {
                if error.refusal == .phoneRevoked || error.refusal == .notEnrolled {
                    return .removed(tr("Box {box} no longer takes this phone ({why}): the presence link ends here. Log in there with your password; to use this phone again, pair it at the box.", ("box", box), ("why", error.message)))
                }
                // Not found: the search itself took its second. Anything else (a refusal, a
                // failed connection) waits longer each time, up to 5 s, rather than knocking
                // several times a second.
                if error.outcome != .notFound { await backOff.wait() }
                continue
            }
            do {
                try await link.send(.attach)
                if case .actionResult(let r) = try await link.next(timeout: .seconds(10)) {
                    if r.outcome == .done { return .back(link) }
                    await link.close()
                    return .gone
                }
            } catch {}
            await link.close()
            await backOff.wait()
        }
    }

    /// Lock or logout asked for while the link is ending or lost: not carried out here.
    private func failPending() {
        let pending = state.withLockedValue { s in defer { s.actions = [] }; return s.actions }
        for (_, done) in pending { done(nil) }
    }
}

extension PresenceLink.Ending: CustomStringConvertible {
    /// In words, for the agent's log.
    public var description: String {
        switch self {
        case .left(let detached): detached ? "handed over, or left without a walk-away" : "left (walking away)"
        case .acted: "the session was locked or ended on it"
        case .sessionGone: "the box has no session for this phone any more"
        case .failed(let why): "failed: \(why)"
        case .removed(let why): "the box no longer takes this phone: \(why)"
        }
    }
}

/// Waits that grow: 250 ms, doubling, up to 5 s.
struct BackOff {
    private var next: Duration = .milliseconds(250)
    mutating func wait() async {
        try? await MonotonicClock().sleep(for: next)
        next = min(next * 2, .seconds(5))
    }
}
