import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio
import FoundationEssentials
import Glibc
import Logging

/// The box: the one place the radio (phone links), the PAM bridge (prompts), logind and the
/// admin socket meet. Its decisions are `BoxState`'s, which takes `now` and does no I/O; this
/// actor holds that state, feeds it events, and performs the effects it asks for
/// (notifications, hang-ups, answers to prompts, audit lines, work). Work that waits on logind
/// or PAM (a lock, a logout, a walk-away, an unlock) runs in `BoxWorker`, which hands each
/// answer back through `update`; the PAM module's own requests wait here between two decisions
/// (`registerPrompt` on logind, `report` on the box's password check, `openSession` on logind).
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
            keepGuardRecord()
            guard !state.effects.isEmpty else { return }
            let effects = state.effects
            state.effects = []
            perform(effects)
        }
    }
    /// Where what the box guards is kept for the next daemon (`resume`), and what it last wrote.
    var guardFile: GuardFile?
    var savedGuard: GuardRecord?
    /// `state.guardVersion` when the record was last built.
    var checkedGuardVersion: UInt64 = 0
    var guardWriteFailed = false
    public nonisolated let identity: BoxIdentity
    let sessions: any SessionControl
    /// Lock and logout through logind, for `BoxWorker`.
    let actions: SessionActions
    let clock: any RadioClock
    let logger: Logger
    let audit: Logger
    /// What the box listens on, or what it waits for (`boxkeyd status`).
    public internal(set) var radioDescription: String
    /// Whether a radio is there: without one, prompts take no pushes and show no code.
    public internal(set) var radioAttached: Bool

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
                userID: @escaping @Sendable (String) -> UInt32? = SystemUsers.uid) {
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

    // MARK: - Restarts

    /// At start: takes up what the daemon before this one guarded (`file`), each session
    /// checked with logind again, and from now on keeps the file up to date.
    public func resume(from path: String) async {
        let file = GuardFile(path: path)
        var record = GuardRecord()
        do { record = try file.load() ?? GuardRecord() } catch {
            logger.warning("\(error): starting with no session on record (walk-away locks every local session of a returning phone's user, and ends none)")
        }
        var answers: [String: Result<LoginSession?, any Error>] = [:]
        for s in record.sessions {
            do { answers[s.id] = .success(try await sessions.session(id: s.id)) } catch {
                logger.warning("logind did not answer for session \(logSafe(s.id)) of the daemon before this one (\(error)): guarding it as recorded")
                answers[s.id] = .failure(error)
            }
        }
        if !record.isEmpty { state.resume(record, answers: answers, now: clock.now) }
        guardFile = file
        savedGuard = nil
        keepGuardRecord()
    }

    /// Writes the guarded state when it changed. A failed write (a full /run) is said once,
    /// and tried again at the next change: this daemon still guards all it knows.
    private func keepGuardRecord() {
        guard let guardFile, state.guardVersion != checkedGuardVersion || savedGuard == nil else { return }
        checkedGuardVersion = state.guardVersion
        let record = state.guardRecord
        guard record != savedGuard else { return }
        // Not yet made (the PAM bridge makes the socket's folder): nothing was guarded before,
        // and the next change writes it.
        guard access(guardFile.path.parentDirectory, F_OK) == 0 else { return }
        do {
            try guardFile.save(record)
            savedGuard = record
            if guardWriteFailed { logger.notice("\(guardFile.path) written again: walk-away survives a restart") }
            guardWriteFailed = false
        } catch {
            if !guardWriteFailed { logger.error("\(error): after a restart of boxkeyd, walk-away would not know the sessions on record") }
            guardWriteFailed = true
        }
    }

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
        if let refused = state.promptRefusal(request, pid: peer.pid, noRadio: radioAttached ? nil : radioDescription) { return (nil, refused) }
        let owner: Result<LoginSession?, any Error>
        do { owner = .success(try await sessions.promptOwner(pid: peer.pid, request)) } catch { owner = .failure(error) }
        return state.admitPrompt(request, owner: owner, pid: peer.pid, now: clock.now)
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

    /// Runs every timeout that is due (handshakes, prompts, grace periods, keepalives). A
    /// walk-away is queued work (`BoxWorker`): the timers never wait on logind.
    public func tick() {
        ticking = true
        ticks += 1
        defer { ticking = false }
        let now = clock.now
        for away in state.tick(now: now) { state.queueWalkAway(away) }
        for id in Array(state.presences.keys) {
            if let away = state.checkPresence(id, now: now) { state.queueWalkAway(away) }
        }
    }

    /// An RSSI reading of a presence link (nil: the read failed, which is no sample).
    public func rssiSample(_ id: CentralID, _ rssi: Int?, now: Duration) {
        if let away = state.rssiSample(id, rssi, now: now) { state.queueWalkAway(away) }
    }

    /// Hands `BoxWorker` what logind or PAM answered: `body` is a decision of the state's,
    /// given the time; its effects follow at once.
    func update<T: Sendable>(_ body: @Sendable (inout BoxState, Duration) -> T) -> T {
        body(&state, clock.now)
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
}
