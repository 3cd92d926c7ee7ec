import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio
import FoundationEssentials
import Glibc
import Logging
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

    /// The pushed user, if a push came.
    public var pushedUser: String? {
        switch self {
        case .push(let user, _, _), .keyLogin(let user, _), .escrowCapture(let user, _): user
        case .noPush: nil
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

/// The box: the one place the radio (phone links), the PAM bridge (prompts), logind and the
/// admin socket meet. Its decisions are `BoxState`'s, which takes `now` and does no I/O; this
/// actor holds that state, feeds it events, performs the effects it asks for (notifications,
/// hang-ups, answers to prompts, audit lines) and runs the steps that wait on the system:
/// logind's answers (`registerPrompt`, `openSession`, locks in `Box+Sessions`) and the box's
/// own password check (`Box+Verdicts`).
///
/// For every push: the phone is the Noise-authenticated static key, enrolled for the pushed
/// user; the prompt is the single waiting prompt that may log that user in, in a configured
/// service, asked for by a local process (logind); the session is what logind says the PAM
/// stack opened or the locker sits in, for that user's uid.
public actor Box {
    /// Every change to the state is followed at once by the effects it asked for (a `didSet`
    /// on a value that is modified in place: no copy, and no decision can forget them).
    var state: BoxState {
        didSet {
            guard !state.effects.isEmpty else { return }
            let effects = state.effects
            state.effects = []
            perform(effects)
        }
    }
    public nonisolated let identity: BoxIdentity
    let sessions: any SessionControl
    /// Lock and logout through logind, for `Box+Sessions`.
    let actions: SessionActions
    let clock: any RadioClock
    let logger: Logger
    let audit: Logger
    /// What the box listens on, or what it waits for (`boxkeyd status`).
    public internal(set) var radioDescription: String
    /// Whether a radio is there: without one, prompts take no pushes and show no code.
    public internal(set) var radioAttached: Bool
    /// A user's uid (the system's user database; tests give a table).
    let userID: @Sendable (String) -> UInt32?

    let outbox: AsyncStream<RadioAction>
    let outboxContinuation: AsyncStream<RadioAction>.Continuation
    let work: AsyncStream<BoxWork>
    let workContinuation: AsyncStream<BoxWork>.Continuation
    /// The Enters that wait for a phone's push (`take`), by prompt.
    var waiters: [UInt64: PromptWaiter] = [:]
    /// Publishes a phone enrolled here by a pairing code to the directory (`[fleet] publish`).
    var fleetPublisher: (@Sendable (PublicKey, String, String) -> Void)?

    /// Wakes the timer loop when a new deadline appears.
    let doorbell = ChangeSignal()
    /// Wakes the presence service when a presence link appears.
    let presenceChanged = ChangeSignal()
    /// While the timer loop runs `tick`, new deadlines need no ring: the loop asks for the next
    /// deadline right after. (Ringing from inside a tick made the loop spin while a phone was
    /// connected.)
    var ticking = false
    /// How often the timer loop has run: tests check an idle link costs (almost) nothing.
    public private(set) var ticks = 0
    /// What the last reload did (`boxkeyd status`).
    public internal(set) var lastReload: String?

    public init(config: DaemonConfig, identity: BoxIdentity, registry: PhoneRegistry, escrow: EscrowStore? = nil, sessions: any SessionControl,
                clock: any RadioClock, logger: Logger, radioDescription: String, radioAttached: Bool = true,
                userID: @escaping @Sendable (String) -> UInt32? = Box.systemUserID) {
        self.userID = userID
        state = BoxState(config: config, identity: identity, registry: registry,
                         escrow: escrow ?? EscrowStore(path: config.stateDirectory + "/escrow.json"), userID: userID)
        self.identity = identity
        self.sessions = sessions
        self.clock = clock
        self.logger = logger
        var audit = logger
        audit[metadataKey: "audit"] = "true"
        self.audit = audit
        actions = SessionActions(sessions: sessions, clock: clock, audit: audit, logger: logger, userID: userID)
        self.radioDescription = radioDescription
        self.radioAttached = radioAttached
        (outbox, outboxContinuation) = AsyncStream.makeStream(of: RadioAction.self)
        (work, workContinuation) = AsyncStream.makeStream(of: BoxWork.self)
    }

    /// Does what the state's decisions asked for, in their order.
    private func perform(_ effects: [BoxEffect]) {
        for effect in effects {
            switch effect {
            case .radio(let action): outboxContinuation.yield(action)
            case .work(let job): workContinuation.yield(job)
            case .answer(let id, let answer): waiters.removeValue(forKey: id)?.resume(returning: answer)
            case .audit(let r):
                audit.audit(r.level, r.event, "\(r.message)", phone: r.phone, user: r.user, service: r.service,
                            file: r.file, function: r.function, line: r.line)
            case .log(let level, let message): logger.log(level: level, "\(message)")
            case .wakeTimers: if !ticking { doorbell.signal() }
            case .presenceChanged: presenceChanged.signal()
            case .publish(let phone, let user, let name): fleetPublisher?(phone, user, name)
            }
        }
    }

    public var config: DaemonConfig { state.config }

    /// SIGHUP: takes the new settings that can change while running (limits, enrolment,
    /// presence, services, timeouts); returns the changed keys that need a restart.
    public func reload(_ reloaded: DaemonConfig) -> (changed: [String], needRestart: [String]) {
        state.reload(reloaded, now: clock.now)
    }

    // MARK: - Radio

    public var gattService: GATTService { state.gattService }
    public var advertisingData: AdvertisingData { state.advertisingData }
    public func rotateNonce() { state.rotateNonce() }
    public func handle(_ event: PeripheralEvent) { state.handle(event, now: clock.now) }

    // MARK: - PAM bridge

    /// A module asks to wait for a push. Phone login is offered only in configured services,
    /// to a local process (logind), and the answer says what to show: box ID, the box key's
    /// fingerprint in full, and the pairing code.
    public func registerPrompt(_ request: PAMRequest.WaitRequest, peer: PAMPeer) async -> (id: UInt64?, reply: PAMReply) {
        let what = "\(logSafe(request.service))\(request.tty.isEmpty ? "" : " on \(logSafe(request.tty))") (pid \(peer.pid))"
        guard radioAttached else {
            audit.audit(.info, .notOffered, "not offering phone login to \(what): \(radioDescription)", service: request.service)
            return (nil, .notOffered("no radio: \(radioDescription)"))
        }
        guard state.config.phoneLoginServices.contains(request.service) else {
            audit.audit(.info, .notOffered, "not offering phone login to \(what): service not configured for it", service: request.service)
            return (nil, .notOffered("phone login is not enabled for \(request.service)"))
        }
        var owner: LoginSession?
        do {
            owner = try await sessions.session(ofPID: peer.pid)
            if owner == nil, request.tty.isEmpty, request.display.isEmpty, request.remoteHost.isEmpty {
                // A display manager's worker that names no terminal, display or host while it
                // authenticates (greetd): local if its parent, the display manager, runs a greeter
                // in a local greeter session of logind's. The kernel says who the parent is,
                // logind whose session its children are. A worker that names a terminal or a
                // display is judged by them (an XDMCP display is remote whatever its siblings).
                owner = try await greeterBeside(peer.pid)
            }
        } catch {
            audit.audit(.warning, .notOffered, "not offering phone login to \(what): logind did not answer (\(error))", service: request.service)
            return (nil, .notOffered("logind did not answer"))
        }
        if let why = Locality.refusal(request, owner: owner) {
            audit.audit(.notice, .notOffered, "not offering phone login to \(what): \(why)", service: request.service)
            return (nil, .notOffered(why))
        }
        let opened = state.openPrompt(request, owner: owner, pid: peer.pid, now: clock.now)
        return (opened.id, opened.reply)
    }

    /// The local greeter session of one of `pid`'s siblings (its parent's other children).
    private func greeterBeside(_ pid: Int32) async throws -> LoginSession? {
        guard let parent = ProcessTree.parent(of: pid), parent > 1 else { return nil }
        for sibling in ProcessTree.children(of: parent) where sibling != pid {
            if let s = try await sessions.session(ofPID: sibling), s.sessionClass == "greeter", s.isLocal { return s }
        }
        return nil
    }

    /// Enter at prompt `id` with nothing typed: the push held there, at once; the push of the
    /// phone whose offer waits there (asked now), within `wait`; else `.noPush(.nothingYet)` at
    /// once, and the prompt stays open.
    public func take(_ id: UInt64, wait: Duration) async -> PromptAnswer {
        if case .answer(let answer) = state.enter(id, wait: wait, now: clock.now) { return answer }
        // Cancelled (shutdown, or the PAM connection's task ending), the wait ends at once, from
        // the cancelling thread; the prompt's own state is cleared when the bridge closes it.
        let waiter = PromptWaiter()
        let answer = await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<PromptAnswer, Never>) in
                guard state.prompts[id]?.entered == true, waiter.wait(c) else {
                    c.resume(returning: .noPush(.shuttingDown))
                    return
                }
                waiters[id] = waiter
                state.waiting.insert(id)
            }
        } onCancel: {
            waiter.resume(returning: .noPush(.shuttingDown))
        }
        // Answered by the cancellation: the Enter is over, and a push the offering phone sends
        // now finds the prompt as it was before it (held for the next Enter, not delivered to
        // a wait nobody reads).
        if Task.isCancelled {
            waiters[id] = nil
            state.endWait(id, .shuttingDown)
        }
        return answer
    }

    /// The module has a delivered push: its next requests are about that push.
    public func hasPush(_ id: UInt64) -> Bool { state.hasPush(id) }

    /// The module is done with the prompt without a delivered push (the person typed a
    /// password, cancelled, or its process ended), or its connection closed.
    public func promptClosed(_ id: UInt64) async {
        guard let prompt = state.prompts[id] else { return }
        if prompt.delivered, prompt.verifying != nil {
            // The stack ended without a report (the application died): tell the phone no.
            await report(id, .rejected, reason: "the login was abandoned")
            state.prompts.remove(id)
            return
        }
        state.promptWentOn(id, now: clock.now)
    }

    // MARK: - Time

    /// Runs every timeout that is due (handshakes, prompts, grace periods, keepalives).
    public func tick() async {
        ticking = true
        ticks += 1
        defer { ticking = false }
        let now = clock.now
        for away in state.tick(now: now) { await walkAway(away) }
        for id in Array(state.presences.keys) {
            if let away = state.checkPresence(id, now: now) { await walkAway(away) }
        }
    }

    /// An RSSI reading of a presence link (nil: the read failed, which is no sample).
    public func rssiSample(_ id: CentralID, _ rssi: Int?, now: Duration) async {
        state.presences[id]?.sample(rssi, now: now)
        if let away = state.checkPresence(id, now: now) { await walkAway(away) }
    }

    /// The presence links whose RSSI should be read now (`PresenceService`).
    public func presenceReadsDue() -> [CentralID] { state.presenceReadsDue(now: clock.now) }

    public func nextPresenceRead() -> Duration? { state.nextPresenceRead }

    /// The earliest time anything needs attention, or nil when the box is idle.
    public func nextDeadline() -> Duration? { state.nextDeadline }

    public func shutdown() {
        state.shutdown(now: clock.now)
        outboxContinuation.finish()
        workContinuation.finish()
        doorbell.signal()
    }

    // MARK: - Users

    nonisolated func uid(of user: String) -> UInt32? { userID(user) }

    static let rootRefusal = "phones are not enrolled for root at this box: log in as yourself and use sudo, or set [enrolment] root = true in boxkeyd.conf"

    /// The name the user database gives for `user` (nil: none), to tell an exact match from a
    /// case-insensitive one.
    static func accountName(_ user: String) -> String? {
        guard let pw = getpwnam(user) else { return nil }
        return String(cString: pw.pointee.pw_name)
    }

    public static let systemUserID: @Sendable (String) -> UInt32? = { user in
        guard let pw = getpwnam(user) else { return nil }
        return UInt32(pw.pointee.pw_uid)
    }
}
