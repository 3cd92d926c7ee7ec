import BoxkeyCore
import BoxkeyRadio
import FoundationEssentials
import Glibc
import NIOConcurrencyHelpers

/// `boxkey agent`, in the spirit of ssh-agent: the vault is opened once, and the credentials
/// stay in locked memory (libsodium's guarded, mlock'ed pages) for `lifetime`; they are dropped
/// on `boxkey lock`, on suspend, on `boxkey agent forget`, and when the lifetime ends. It logs
/// in for `boxkey login` (no PIN, no vault read, no Argon2id) and holds the presence link and
/// its re-attachment. `AgentServer` puts it on a socket only its user can reach.
public actor Agent {
    struct Held {
        let user: String
        let password: SecureBytes
        let until: Duration
        let unlockedAt: Duration
    }

    /// Proximity login (opt-in: `boxkey agent start --proximity`): when a paired box's prompt
    /// waits and the box is near, offer the login; the person presses Enter at the box.
    public struct Proximity: Sendable {
        /// Mean RSSI of the last `samples` advertisements heard (in scans one after the other,
        /// none older than `Agent.freshness`); the last, heard with a prompt waiting, must reach
        /// it too.
        public var thresholdDBm: Int = -65
        public var samples: Int = 3
        /// Only this long after the PIN was given: a phone left in a drawer all day offers nothing.
        public var window: Duration = .seconds(30 * 60)
        public init() {}
    }

    var phone: Phone
    let radio: any PhoneRadio
    private let lifetime: Duration
    let log: @Sendable (String) -> Void
    /// The agent's time: CLOCK_BOOTTIME (`BootClock`), so a suspend counts; a test's
    /// `ManualClock`.
    let clock: any RadioClock
    var held: Held?
    var presence: PresenceLink?
    var busy = false
    var stopRequested = false
    /// Told whether the password is in this process, whenever that changes (`AgentServer`'s
    /// sleep inhibitor): held, or copied by a login still in progress.
    private var holdingObserver: (@Sendable (Bool) async -> Void)?
    /// Logins in progress, each with its own reference to the password: it stays in memory
    /// until they end, even after `forget`.
    var loginsInProgress = 0
    /// Moves on at every drop: an unlock that finishes after one is discarded.
    private var drops = 0
    /// Link work that outlives a request: presence links to run, and links to detach and
    /// close once the answer is out. `AgentServer` runs them in its task group.
    enum LinkJob: Sendable { case presence(PresenceLink), detachAndClose(BoxLink) }
    nonisolated let linkJobs: AsyncStream<LinkJob>
    let linkJobContinuation: AsyncStream<LinkJob>.Continuation

    let proximity: Proximity?
    /// RSSI heard per box, with when, newest last.
    var heardNear: [BoxID: [(at: Duration, rssi: Int)]] = [:]
    /// No new offer before this (after one ended, so a refused or ignored offer is not repeated
    /// at once).
    var nextOffer: Duration?
    /// Boxes that refused this phone as revoked or not enrolled: no more offers there (said
    /// once) until the agent starts again, after a new pairing.
    var refusedOffers: Set<BoxID> = []
    var scanning = false

    public init(phone: Phone, radio: any PhoneRadio, lifetime: Duration, proximity: Proximity? = nil, clock: any RadioClock = BootClock(),
                log: @escaping @Sendable (String) -> Void) {
        self.proximity = proximity
        self.clock = clock
        self.phone = phone
        self.radio = radio
        self.lifetime = lifetime
        self.log = log
        (linkJobs, linkJobContinuation) = AsyncStream.makeStream()
    }

    /// Sets who is told whether credentials are held, and tells it now.
    public func onHoldingChanged(_ observer: @escaping @Sendable (Bool) async -> Void) async {
        holdingObserver = observer
        await observer(held != nil)
    }

    /// Opens the vault with `pin` and holds the credentials. The attempt is counted as any.
    /// The vault's lock and Argon2id run off the actor: `forget`, `stop` and the lifetime must
    /// never wait behind them (another process could hold the vault's lock for long).
    public func unlock(pin: SecureBytes?) async throws(PhoneFailure) {
        let phone = phone, dropsBefore = drops
        let opened = await Task.detached { () -> Result<(user: String, password: SecureBytes), PhoneFailure> in
            do {
                var vault = try phone.vault()
                return .success(try vault.credentials(pin: pin, now: vaultNow()))
            } catch let f as PhoneFailure {
                return .failure(f)
            } catch let f as Vault.Failure {
                return .failure(f.asPhoneFailure)
            } catch {
                return .failure(PhoneFailure(.failure, "\(error)"))
            }
        }.value
        let (user, password) = try opened.get()
        guard drops == dropsBefore, !stopRequested else {
            throw PhoneFailure(.failure, "the credentials were dropped while the vault was being opened")
        }
        held = Held(user: user, password: password, until: clock.now + lifetime, unlockedAt: clock.now)
        log("credentials for \(user) held for \(spokenDuration(lifetime))")
        await holdingObserver?(true)
    }

    /// Drops the credentials (the presence link stays: it carries no secret).
    public func forget(_ why: String) async {
        drops += 1
        // Whatever drops the credentials (asked, lock, stop, a suspend, the lifetime) takes back
        // a push still waiting for Enter: the person is leaving, or asked the phone to forget.
        withdrawPushes()
        guard held != nil else { return }
        held = nil  // SecureBytes zeroes and frees its pages
        log("credentials dropped (\(why))" + (loginsInProgress > 0 ? "; the login in progress keeps its copy until it ends" : ""))
        await settleHolding()
    }

    /// Tells the observer the password is gone once no login holds a copy either.
    func settleHolding() async {
        if held == nil, loginsInProgress == 0 { await holdingObserver?(false) }
    }

    /// Called about once a second: the lifetime runs out here.
    public func tick() async {
        if let held, clock.now >= held.until { await forget("lifetime over") }
    }

    public func status() -> AgentStatus {
        let kind = held.map { CredentialPush(user: $0.user, password: $0.password, deviceName: "").kind }
        return AgentStatus(pid: getpid(), credentialsHeld: held != nil, user: held?.user,
                           expiresInSeconds: held.map { Int(($0.until - clock.now).components.seconds) },
                           presence: presence.map { .init(box: $0.box.description, connected: $0.isConnected) },
                           mode: kind?.rawValue,
                           proximity: proximity != nil,
                           proximityOpen: proximity.flatMap { p in held.map { clock.now - $0.unlockedAt < p.window } })
    }

    /// Serves one request; `reply` is told progress lines and the final answer. `withdrawal`
    /// is asked when the client goes away (Ctrl-C): a login's push still waiting for Enter is
    /// taken back.
    public func handle(_ request: AgentRequest, withdrawal: Withdrawal = Withdrawal(), reply: @escaping @Sendable (AgentReply) -> Void) async {
        switch request {
        case .status:
            reply(.result(.success, message: statusText(), details: Self.json(status())))
        case .unlock(let pin):
            do {
                try await unlock(pin: pin)
                reply(.result(.success, message: "unlocked", details: ""))
            } catch {
                reply(.result(error.outcome, message: error.message, details: ""))
            }
        case .forget:
            await forget("asked to")
            reply(.result(.success, message: "The agent dropped the credentials.", details: ""))
        case .stop:
            stopRequested = true
            await forget("stopping")
            presence?.leave(detach: false)
            linkJobContinuation.finish()
            reply(.result(.success, message: "Agent stopped.", details: ""))
        case .login(let box, let stay):
            await exclusive(reply) { try await self.login(box, stay: stay, withdrawal: withdrawal, reply: reply) }
            await settleHolding()
        case .act(let action, let box):
            // The person is leaving: the credentials go now, even if the agent is busy; the
            // lock itself waits for the job in hand (a login) rather than being refused.
            if action == .lock { await forget("boxkey lock") }
            await exclusive(reply, waitUpTo: Self.actionWait) { try await self.act(action, box: box) }
        }
    }

    /// How long a lock or logout waits for a radio job in hand (a login: its search and answer).
    static let actionWait: Duration = .seconds(30)

    /// One radio job at a time: a second waits up to `waitUpTo` for the first, else it is told
    /// the agent is busy. A job that returns nil has replied itself.
    private func exclusive(_ reply: @Sendable (AgentReply) -> Void, waitUpTo wait: Duration = .zero,
                           _ job: () async throws -> AgentReply?) async {
        let deadline = clock.now + wait
        while busy, clock.now < deadline, !stopRequested {
            try? await clock.sleep(for: .milliseconds(50))
        }
        guard !busy else { reply(.result(.failure, message: "the agent is busy with another request; try again", details: "")); return }
        busy = true
        defer { busy = false }
        do { if let answer = try await job() { reply(answer) } } catch let f as PhoneFailure {
            reply(.result(f.outcome, message: f.message, details: ""))
        } catch {
            reply(.result(.failure, message: "\(error)", details: ""))
        }
    }

    /// The pushes of logins in progress, each taken back if it still waits for Enter.
    private var pushesInFlight: [ObjectIdentifier: Withdrawal] = [:]

    /// `forget`: no push of this phone stays at a prompt.
    private func withdrawPushes() {
        for w in pushesInFlight.values where w.ask() { log("withdrawing the push that waits for Enter") }
    }

    private func login(_ box: BoxID?, stay: Bool, withdrawal: Withdrawal, reply: @escaping @Sendable (AgentReply) -> Void) async throws(PhoneFailure) -> AgentReply? {
        await tick()
        guard let held else {
            let vault = try phone.vault()
            guard vault.hasPIN else {
                try await unlock(pin: nil)
                return try await login(box, stay: stay, withdrawal: withdrawal, reply: reply)
            }
            return .needPIN
        }
        let id = try phone.boxID(box)
        try phone.checkReachable(id)
        // Logged in there already: a second link from this phone would push the presence link
        // aside (the box takes one link per phone for its session).
        if let presence, presence.box == id, presence.isConnected {
            throw PhoneFailure(.failure, tr("you are logged in on box {box}: the agent (pid {pid}) holds its presence link. Use `boxkey lock` or `boxkey logout` first.", ("box", id), ("pid", getpid())))
        }
        loginsInProgress += 1
        pushesInFlight[ObjectIdentifier(withdrawal)] = withdrawal
        defer {
            loginsInProgress -= 1
            pushesInFlight[ObjectIdentifier(withdrawal)] = nil
        }
        var phone = phone
        defer { self.phone = phone }
        let (report, link) = try await phone.login(to: id, user: held.user, password: held.password, radio: radio.central, withdrawal: withdrawal,
                                                   progress: { elapsed in reply(.progress("looking for box \(id)… \(elapsed.components.seconds) s")) },
                                                   awaitingEnter: { reply(.say($0.sentence(box: id))) })
        log(report.sentence)
        // The answer goes out first: closing the link takes round trips the person need not wait for.
        reply(.result(.success, message: report.sentence + (stay ? " The agent holds the presence link." : ""), details: Self.json(report)))
        if stay {
            // A new presence link replaces the old one, which leaves without a walk-away.
            presence?.leave(detach: true)
            let link = PresenceLink(box: id, link: link, phone: phone, radio: radio, log: log)
            presence = link
            linkJobContinuation.yield(.presence(link))
        } else {
            linkJobContinuation.yield(.detachAndClose(link))
        }
        return nil
    }

    func presenceEnded(_ link: PresenceLink, _ ending: PresenceLink.Ending) {
        log("presence link to box \(link.box) ended: \(ending)")
        if presence === link { presence = nil }
    }

    /// Lock and logout: over the presence link to that box if there is one, else a new link.
    /// Locking also drops the credentials: the person is leaving.
    private func act(_ action: ActionResult.Action, box: BoxID?) async throws(PhoneFailure) -> AgentReply {
        let id = try phone.boxID(box)
        if let presence, presence.box == id, presence.isConnected {
            let result = await withCheckedContinuation { (c: CheckedContinuation<Result<Void, PhoneFailure>?, Never>) in
                presence.act(action) { c.resume(returning: $0) }
            }
            switch result {
            case .success?: return .result(.success, message: action == .lock ? tr("Locked your session on box {box}.", ("box", id)) : tr("Logged out of box {box}.", ("box", id)), details: "")
            case .failure(let f)?: throw f
            case nil: break  // the link went before it could act: a new one below
            }
        }
        do {
            var phone = phone
            defer { self.phone = phone }
            let link = try await phone.connect(to: id, radio: radio.central)
            try await Phone.act(action, on: link, box: id)
        }
        return .result(.success, message: action == .lock ? tr("Locked your session on box {box}.", ("box", id)) : tr("Logged out of box {box}.", ("box", id)), details: "")
    }

    private func statusText() -> String {
        let s = status()
        func line(_ label: String, _ text: String) -> String { label.padding(13) + text }
        var lines = [line(tr("agent:"), tr("running (pid {pid})", ("pid", s.pid)))]
        if let user = s.user, let left = s.expiresInSeconds {
            lines.append(line(tr("credentials:"), tr("held for {user}, {minutes} min {seconds} s left", ("user", user), ("minutes", left / 60), ("seconds", left % 60))))
        } else {
            lines.append(line(tr("credentials:"), tr("not held (the next login asks for the PIN)")))
        }
        if let p = s.presence {
            lines.append(line(tr("presence:"), p.connected ? tr("box {box}, connected", ("box", p.box)) : tr("box {box}, looking for the box", ("box", p.box))))
        }
        return lines.joined(separator: "\n")
    }

    static func json(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return (try? encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? ""
    }
}
