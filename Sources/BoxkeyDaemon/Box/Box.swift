import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio
import FoundationEssentials
import Glibc
import Logging

/// What the box must send or do on the radio. One task performs these in order, so the
/// fragments of two messages to one phone never interleave.
enum RadioAction: Sendable {
    case notify(CentralID, fragments: [[UInt8]])
    case disconnect(CentralID)
    case advertise(AdvertisingData)
    /// The Info characteristic's new value (a fleet box's certificate or revocation list changed).
    case setInfo([UInt8])
}

/// Work a decision starts but does not wait for (logind calls take their time, and the actor
/// must keep serving meanwhile). `RadioService` runs each job as a child task of its own, so
/// the work belongs to a service of the ServiceGroup and ends with it.
enum BoxWork: Sendable {
    /// Lock, logout or attach, asked on a phone's link.
    case act(ActionResult.Action, link: CentralID)
    /// `[unlock] logind_unlock`: a push with no prompt open, verified and unlocked here.
    case unlockThroughLogind(CredentialPush, phone: PublicKey, link: CentralID)
    /// After a walk-away lock: checks the sessions did lock, and ends those that did not.
    case settle(locked: [LoginSession], phone: PublicKey, endable: Set<String>)
}

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

/// Who is on the other end of a PAM socket connection, from SO_PEERCRED.
public struct PAMPeer: Sendable {
    public var pid: Int32
    public var uid: UInt32
    public init(pid: Int32, uid: UInt32) { self.pid = pid; self.uid = uid }
}

/// The box: routes between the phone links (radio), the prompts (PAM bridge), enrolment,
/// sessions and presence. The decisions live in small values that take `now` —
/// `BoxConnection`, `Enrolment`, `PromptTable`, `SessionRegistry`, `PresenceMonitor`,
/// `RateLimiter` — and this actor holds them, does the I/O they ask for, and audits.
///
/// For every push: the phone is the Noise-authenticated static key, enrolled for the pushed
/// user; the prompt is the single waiting prompt that may log that user in, in a configured
/// service, asked for by a local process (logind); the session is what logind says the PAM
/// stack opened or the locker sits in, for that user's uid.
public actor Box {
    private(set) var config: DaemonConfig
    public nonisolated let identity: BoxIdentity
    var registry: PhoneRegistry
    var escrow: EscrowStore
    let sessions: any SessionControl
    let clock: any RadioClock
    let logger: Logger
    let audit: Logger
    /// What the status command reports as the radio in use.
    /// What the box listens on, or what it waits for (`boxkeyd status`).
    public internal(set) var radioDescription: String
    /// Whether a radio is there: without one, prompts take no pushes and show no code.
    public internal(set) var radioAttached: Bool
    /// A user's uid (the system's user database; tests give a table).
    let userID: @Sendable (String) -> UInt32?

    // Radio
    var nonces = AdvertisementNonces.random()
    var replayCache = HandshakeReplayCache()
    var links: [CentralID: PhoneLink] = [:]
    let outbox: AsyncStream<RadioAction>
    let outboxContinuation: AsyncStream<RadioAction>.Continuation
    let work: AsyncStream<BoxWork>
    let workContinuation: AsyncStream<BoxWork>.Continuation

    // Trust
    var enrolment: Enrolment
    var prompts = PromptTable()
    var waiters: [UInt64: CheckedContinuation<PromptAnswer, Never>] = [:]
    var registered = SessionRegistry()
    /// Users whose session the box locked: a phone must push again (unlock), not just attach.
    var lockedUsers: Set<String> = []
    /// The fleet directory's phones as last read (nil: no `[fleet]`, or never read).
    var fleetRoster: FleetRoster?
    var fleetHealth = FleetHealth()
    /// This box's fleet certificate and the fleet's current revocation list, as Info serves
    /// them (empty: not a certified box).
    var fleetCredentials: [UInt8] = []
    /// Publishes a phone enrolled here by a pairing code to the directory (`[fleet] publish`).
    var fleetPublisher: (@Sendable (PublicKey, String, String) -> Void)?

    // Presence
    var presences: [CentralID: PresenceMonitor] = [:]
    var graces: [PublicKey: Grace] = [:]

    // Limits
    /// Failed or stalled handshakes, and unknown keys, per radio address: a flooding address
    /// is cut off at connect, and enrolled phones' budgets are never touched by it.
    var failedHandshakes: RateLimiter<DeviceAddress>
    var rejectedByPhone: RateLimiter<PublicKey>
    /// Proximity offers per phone: an enrolled phone cannot hold prompts with its offer on them
    /// over and over (each may stand up to `max_wait_s`).
    var offersByPhone = RateLimiter<PublicKey>(limit: Box.offersPerPhone, window: .seconds(300))
    static let offersPerPhone = 3
    var rejectedByUser: RateLimiter<String>
    /// Rejected pushes of all phones not (yet) enrolled for the user they pushed for, together.
    var rejectedNewPhones: RateLimiter<String>
    static let newPhones = "new phones"

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

    struct PhoneLink {
        var id: CentralID
        var mtu: Int
        var connectedAt: Duration
        /// Its address had too many failed handshakes in the last minute when it connected.
        var limited = false
        var reassembler = FrameReassembler()
        var connection: BoxConnection
        var subscribed = false
        /// The box has hung up: writes already queued behind the decision are discarded, not
        /// processed (a flood would otherwise be counted and logged once per queued write).
        var dropped = false
        var mtuLogged = false
        /// Answers ready before the phone's subscription was seen: a phone enables
        /// notifications and writes its first message together, and the two may be reported
        /// in either order. Sent when the subscription arrives; a link that never subscribes
        /// ends at its handshake or command timeout.
        var unsent: [[UInt8]] = []
        var prompt: UInt64?
        /// The code this link's pairing handshake was answered under.
        var pairingCode: Enrolment.LiveCode?
    }

    struct Grace {
        var user: String
        var deadline: Duration
        var reason: String
    }

    public init(config: DaemonConfig, identity: BoxIdentity, registry: PhoneRegistry, escrow: EscrowStore? = nil, sessions: any SessionControl,
                clock: any RadioClock, logger: Logger, radioDescription: String, radioAttached: Bool = true,
                userID: @escaping @Sendable (String) -> UInt32? = Box.systemUserID) {
        self.userID = userID
        self.escrow = escrow ?? EscrowStore(path: config.stateDirectory + "/escrow.json")
        self.config = config
        self.identity = identity
        self.registry = registry
        self.sessions = sessions
        self.clock = clock
        self.logger = logger
        var audit = logger
        audit[metadataKey: "audit"] = "true"
        self.audit = audit
        self.radioDescription = radioDescription
        self.radioAttached = radioAttached
        enrolment = Enrolment(lifetime: config.pairingCodeLifetime, tries: config.pairingCodeTries, pendingWindow: config.pendingEnrolment)
        failedHandshakes = RateLimiter(limit: config.failedHandshakesPerMinute, window: .seconds(60))
        rejectedByPhone = RateLimiter(limit: config.rejectedPushesPerPhone, window: config.rejectionWindow)
        rejectedByUser = RateLimiter(limit: config.rejectedPushesPerUser, window: config.rejectionWindow)
        rejectedNewPhones = RateLimiter(limit: config.rejectedPushesPerPhone, window: config.rejectionWindow)
        (outbox, outboxContinuation) = AsyncStream.makeStream(of: RadioAction.self)
        (work, workContinuation) = AsyncStream.makeStream(of: BoxWork.self)
    }

    /// SIGHUP: takes the new settings that can change while running (limits, enrolment,
    /// presence, services, timeouts); returns the changed keys that need a restart. Counts and
    /// links in progress carry on under the new limits.
    public func reload(_ reloaded: DaemonConfig) -> (changed: [String], needRestart: [String]) {
        let (next, needRestart) = config.reloading(reloaded)
        let changed = config.changes(to: next)
        config = next
        enrolment.lifetime = next.pairingCodeLifetime
        enrolment.tries = next.pairingCodeTries
        enrolment.pendingWindow = next.pendingEnrolment
        failedHandshakes.limit = next.failedHandshakesPerMinute
        rejectedByPhone.limit = next.rejectedPushesPerPhone
        rejectedByPhone.window = next.rejectionWindow
        rejectedByUser.limit = next.rejectedPushesPerUser
        rejectedByUser.window = next.rejectionWindow
        rejectedNewPhones.limit = next.rejectedPushesPerPhone
        rejectedNewPhones.window = next.rejectionWindow
        // Proximity turned off: an offer on a screen is withdrawn (Enter there brings the
        // password prompt), unless the person already asked.
        if !next.proximity {
            for prompt in prompts.prompts.values where prompt.offer.map({ !$0.intent }) ?? false {
                withdrawOffer(of: prompt.id, "proximity login was turned off at box \(identity.boxID)")
            }
        }
        // A prompt open in a service no longer listed takes no push any more (Enter there brings
        // the password prompt back); a held push whose wait is longer than the new one is cut to it.
        let now = clock.now
        for prompt in prompts.prompts.values where !prompt.delivered {
            if !next.phoneLoginServices.contains(prompt.request.service) {
                closePrompt(prompt.id, .superseded, now: now)
            } else if prompt.held != nil, let deadline = prompt.deadline, deadline > now + next.enterWait {
                prompts[prompt.id]?.deadline = now + next.enterWait
            }
        }
        wakeTimers()
        return (changed, needRestart)
    }

    // MARK: - Advertisement and GATT

    public var gattService: GATTService {
        GATTService(uuid: BoxkeyProtocol.serviceUUID, characteristics: [
            GATTCharacteristic(uuid: BoxkeyProtocol.infoCharacteristicUUID, properties: .read,
                               value: info.encode()),
            GATTCharacteristic(uuid: BoxkeyProtocol.requestCharacteristicUUID, properties: [.write, .writeWithoutResponse]),
            GATTCharacteristic(uuid: BoxkeyProtocol.responseCharacteristicUUID, properties: .notify),
        ])
    }

    /// What a phone reads before pairing, or before trusting a fleet box: ID, key, and for a
    /// fleet box its certificate and the fleet's revocation list.
    var info: BoxInfo { BoxInfo(boxID: identity.boxID, staticKey: identity.keyPair.publicKey, fleet: fleetCredentials) }

    public var advertisingData: AdvertisingData {
        var flags: Advertisement.Flags = []
        if !prompts.takingPushes.isEmpty { flags.insert(.loginPromptWaiting) }
        if !presences.isEmpty { flags.insert(.sessionActive) }
        let advert = Advertisement(flags: flags, boxID: identity.boxID, nonce: nonces.current,
                                   keyHint: identity.keyPair.publicKey.advertisementHint)
        return AdvertisingData(serviceUUIDs: [BoxkeyProtocol.serviceUUID],
                               manufacturerData: [BoxkeyProtocol.companyID: advert.encode()],
                               interval: config.advertisingInterval)
    }

    func readvertise() { outboxContinuation.yield(.advertise(advertisingData)) }

    /// New nonce: handshakes must name this one or the previous one.
    public func rotateNonce() {
        nonces.rotate()
        replayCache.retain(nonces: nonces.live)
        readvertise()
    }

    // MARK: - Radio events

    public func handle(_ event: PeripheralEvent) {
        let now = clock.now
        switch event {
        case .connected(let id, let mtu):
            // A central has one connection to a peripheral: a new one from the same address
            // means the old one is gone, whenever its disconnection event arrives.
            for stale in links.keys where stale.address == id.address && stale != id {
                linkEnded(stale, reason: .remoteUser, now: now)
                outboxContinuation.yield(.disconnect(stale))
            }
            // An address over its failure budget may still be an enrolled phone whose address
            // someone else borrowed: it is let in, and only an unknown key from it is refused.
            let limited = failedHandshakes.isLimited(id.address, now: now)
            // Links the box has hung up on, or whose channel is closed, wait only for their
            // disconnection event: they hold no slot.
            let live = links.values.filter { !$0.dropped && $0.connection.state != .closed }
            if live.count >= config.maxConnections {
                // Unauthenticated links are free to make: a full box drops the oldest of them
                // rather than refusing everyone after it, so a few random addresses cycling
                // connections cannot keep an enrolled phone out.
                guard let victim = live.filter({ $0.connection.state == .awaitingHandshake })
                        .min(by: { $0.connectedAt < $1.connectedAt }) else {
                    audit.audit(.warning, .connectionRefused, "refused \(id.address) at connect: \(live.count) authenticated connections already")
                    outboxContinuation.yield(.disconnect(id))
                    return
                }
                // Not counted against the victim's address: it may be an honest phone's.
                audit.audit(.notice, .connectionRefused, "dropped \(victim.id.address) (no handshake yet) to make room for \(id.address)")
                links[victim.id] = nil
                drop(victim.id)
            }
            links[id] = PhoneLink(id: id, mtu: mtu, connectedAt: now, limited: limited, connection: BoxConnection(
                identity: identity.keyPair, boxID: identity.boxID, connectedAt: now,
                handshakeTimeout: config.handshakeTimeout, commandTimeout: config.commandTimeout))
            // BlueZ tells the MTU with the first write, not at connect: it is logged then.
            logger.debug("connected \(id)")
            wakeTimers()
        case .subscribed(let id, let characteristic):
            guard characteristic == BoxkeyProtocol.responseCharacteristicUUID, links[id] != nil else { return }
            links[id]!.subscribed = true
            let held = links[id]!.unsent
            links[id]!.unsent = []
            send(held, to: id)
        case .unsubscribed(let id, let characteristic):
            if characteristic == BoxkeyProtocol.responseCharacteristicUUID { links[id]?.subscribed = false }
        case .wrote(let id, let characteristic, let value, let mtu):
            guard characteristic == BoxkeyProtocol.requestCharacteristicUUID, let link = links[id], !link.dropped else { return }
            if !link.mtuLogged || link.mtu != mtu { logger.debug("\(id): ATT MTU \(mtu)") }
            links[id]!.mtu = mtu
            links[id]!.mtuLogged = true
            receive(fragment: value, from: id, mtu: mtu, now: now)
        case .disconnected(let id, let reason):
            linkEnded(id, reason: reason, now: now)
        }
    }

    private func receive(fragment: [UInt8], from id: CentralID, mtu: Int, now: Duration) {
        let message: [UInt8]?
        let wasIdle = links[id]!.reassembler.isIdle
        let hadChannel = links[id]!.reassembler.channel != nil
        do {
            message = try links[id]!.reassembler.receive(fragment, mtu: mtu, now: now)
        } catch {
            audit.audit(.notice, .connectionRefused, "dropped \(id.address): bad fragment: \(error)")
            failedHandshakes.record(id.address, now: now)
            let handshaking = links[id]!.connection.state == .awaitingHandshake
            if handshaking { send([Envelope.refusal(Refusal(.malformed)).encode()], to: id) }
            drop(id)
            return
        }
        if !hadChannel, let channel = links[id]!.reassembler.channel, channel.isHeld(byAnotherLinkThan: id, in: links) {
            // Anything sent on this channel would reach the other phone too: hang up without a word.
            audit.audit(.notice, .connectionRefused, "dropped \(id.address): channel \(channel) is another connection's")
            failedHandshakes.record(id.address, now: now)
            drop(id)
            return
        }
        // A message started: the timer loop must learn its reassembly deadline.
        if wasIdle, !links[id]!.reassembler.isIdle { wakeTimers() }
        guard let message else { return }
        var connection = links[id]!.connection
        let code = enrolment.current(now: now)
        let limited = links[id]!.limited
        let output = connection.receive(message, nonces: nonces, replayCache: &replayCache, now: now,
                                        pairingCode: code?.code) { [self] phone, kind in
            admit(phone, kind, fromLimitedAddress: limited, now: now)
        }
        links[id]!.connection = connection
        if case .pairingAttempt? = output.request { links[id]!.pairingCode = code }
        perform(output, for: id, now: now)
    }

    /// The policy check once a phone's key is known (right after message 1): unknown keys may
    /// only pair; revoked keys nothing; a phone over its rejection budget waits.
    static let slotsPerPhone = 2
    /// Slots the phones of one user hold together (two phones' presence links and a login),
    /// and that phones enrolled for nobody yet (pending, pairing) hold together.
    static let slotsPerUser = 3
    static let slotsForNewPhones = 2

    private func admit(_ phone: PublicKey, _ kind: BoxConnection.HandshakeKind, fromLimitedAddress limited: Bool, now: Duration) -> Refusal.Code? {
        if registry.isRevoked(phone) { return .phoneRevoked }
        // One key holds at most two slots (a presence link and a login, or a link whose end
        // the radio has not reported yet): a phone that keeps opening links cannot fill the box.
        let held = links.values.filter { !$0.dropped && $0.connection.state != .closed && $0.connection.phoneKey == phone }.count
        if held >= Self.slotsPerPhone {
            audit.audit(.notice, .connectionRefused, "refused phone \(phone.fingerprint): it already holds \(held) connections", phone: phone.fingerprint)
            return .busy
        }
        // Nor can one user's keys (four phones enrolled for mallory), or phones enrolled for
        // nobody, fill it: the other slots stay for everyone else.
        let users = Set(enrolledUsers(of: phone))
        let others = links.values.compactMap { link -> Set<String>? in
            guard !link.dropped, link.connection.state != .closed, let key = link.connection.phoneKey else { return nil }
            return Set(enrolledUsers(of: key))
        }
        if users.isEmpty, others.filter(\.isEmpty).count >= Self.slotsForNewPhones {
            audit.audit(.notice, .connectionRefused, "refused phone \(phone.fingerprint): phones enrolled for nobody already hold \(Self.slotsForNewPhones) connections", phone: phone.fingerprint)
            return .busy
        }
        if let user = users.sorted().first(where: { user in others.filter { $0.contains(user) }.count >= Self.slotsPerUser }) {
            audit.audit(.notice, .connectionRefused, "refused phone \(phone.fingerprint): \(logSafe(user))'s phones already hold \(Self.slotsPerUser) connections", phone: phone.fingerprint)
            return .busy
        }
        // An address over its failure budget gets only enrolled keys through. A key enrolled
        // nowhere hears that (a phone revoked in the directory must learn it is not enrolled,
        // not that it failed too often); a pairing from there waits.
        if limited, enrolledUsers(of: phone).isEmpty {
            return kind == .login && enrolment.pendingEnrolment(of: phone, now: now) == nil ? .notEnrolled : .rateLimited
        }
        if kind == .login, enrolledUsers(of: phone).isEmpty, enrolment.pendingEnrolment(of: phone, now: now) == nil {
            return .notEnrolled
        }
        if rejectedByPhone.isLimited(phone, now: now) { return .rateLimited }
        return nil
    }

    private func perform(_ output: BoxConnection.Output, for id: CentralID, now: Duration) {
        send(output.replies, to: id)
        switch output.request {
        case nil:
            break
        case .keepalive?:
            presences[id]?.keepalive(now: now)
        case .pairingAttempt(let phone)?:
            enrolment.attempted(now: now)
            audit.audit(.info, .pairing, "pairing attempt: phone \(phone.fingerprint) from \(id.address) (\(enrolment.live?.triesLeft ?? 0) tries left on the code)", phone: phone.fingerprint)
        case .login(let push)?:
            startLogin(push, from: id, now: now)
        case .offer(let offer)?:
            startOffer(offer, from: id, now: now)
        case .action(.pair)?:
            completePairing(on: id, now: now)
        case .action(let action)?:
            workContinuation.yield(.act(action, link: id))
        case .close(let reason)?:
            closed(id, reason: reason, now: now)
            drop(id)
        }
        wakeTimers()
    }

    private func closed(_ id: CentralID, reason: BoxConnection.CloseReason, now: Duration) {
        let phone = links[id]?.connection.phoneKey
        let who = "\(id.address)\(phone.map { " phone \($0.fingerprint)" } ?? "")"
        switch reason {
        case .refused(let code):
            if code == .handshakeFailed || code == .replayedHandshake || code == .malformed || code == .staleAdvertisement
                || code == .notEnrolled || code == .noPairingCode {
                failedHandshakes.record(id.address, now: now)
            }
            audit.audit(.notice, .connectionRefused, "refused \(who): \(code)", phone: phone?.fingerprint)
        case .protocolViolation(let why):
            if links[id]?.pairingCode != nil { audit.audit(.notice, .pairingFailed, "pairing failed \(who): wrong code (\(why))", phone: phone?.fingerprint) } else {
                audit.audit(.notice, .connectionRefused, "dropped \(who): \(why)", phone: phone?.fingerprint)
            }
        case .timedOut:
            failedHandshakes.record(id.address, now: now)
            logger.info("timed out \(who)")
        case .peerError(let e):
            logger.info("phone \(id.address) ended the channel: \(e.code) \(logSafe(e.detail))")
        case .finished:
            break
        case .detached:
            if let p = presences.removeValue(forKey: id) {
                audit.audit(.info, .presence, "presence link closed by the phone: phone \(p.phone.fingerprint) user \(logSafe(p.user)) (no walk-away action)", phone: p.phone.fingerprint, user: p.user)
                readvertise()
            }
        }
    }

    private func send(_ envelopes: [[UInt8]], to id: CentralID) {
        guard let link = links[id], !link.dropped, !envelopes.isEmpty, let channel = link.reassembler.channel,
              // Whatever is said on a channel reaches every phone on it: never one another link holds.
              !channel.isHeld(byAnotherLinkThan: id, in: links) else { return }
        guard link.subscribed else {
            guard link.unsent.count + envelopes.count <= 4 else {
                logger.notice("\(id.address) did not subscribe to responses; dropping it")
                drop(id)
                return
            }
            links[id]!.unsent += envelopes
            return
        }
        for envelope in envelopes {
            guard let fragments = try? Framing.fragment(envelope, mtu: link.mtu, channel: channel) else { continue }
            outboxContinuation.yield(.notify(id, fragments: fragments))
        }
    }

    func drop(_ id: CentralID) {
        links[id]?.dropped = true
        outboxContinuation.yield(.disconnect(id))
    }

    private func linkEnded(_ id: CentralID, reason: DisconnectReason, now: Duration) {
        guard let link = links.removeValue(forKey: id) else { return }
        logger.debug("disconnected \(id): \(reason)")
        if let presence = presences.removeValue(forKey: id) {
            audit.audit(.info, .presence, "presence link lost: phone \(presence.phone.fingerprint) user \(logSafe(presence.user)) (\(reason))", phone: presence.phone.fingerprint, user: presence.user)
            startGrace(phone: presence.phone, user: presence.user, reason: "link lost (\(reason))", now: now)
            readvertise()
        }
        if link.connection.state == .awaitingPairConfirm {
            audit.audit(.notice, .pairingFailed, "pairing failed: \(id.address) phone \(link.connection.phoneKey?.fingerprint ?? "?") left without proving the code", phone: link.connection.phoneKey?.fingerprint)
        }
        // A PAM stack verifying this link's push still gets its answer; the phone will not.
        if let promptID = link.prompt, prompts[promptID]?.delivered == true {
            logger.info("\(id.address) left while its push was being verified")
        }
        // A push waiting for Enter goes with its phone: Enter there must not log in someone
        // whose phone has left.
        if let promptID = link.prompt, prompts[promptID]?.held != nil, prompts[promptID]?.verifying?.link == id {
            dropHeld(promptID, .notAtPrompt, "the phone left before Enter was pressed at the box", now: now)
        }
        // An offer from a phone that left no longer holds its prompt: Enter there now brings
        // the password prompt at once (`intent`).
        if let promptID = link.prompt, let offer = prompts[promptID]?.offer, offer.link == id, prompts[promptID]?.verifying == nil {
            prompts[promptID]!.offer = nil
            logger.info("\(id.address) left while its proximity offer was on the screen")
            // Enter was pressed for it: nothing else may answer that Enter.
            if prompts[promptID]!.entered { endWait(promptID, .timedOut) }
        }
    }

    // MARK: - Pairing

    private func completePairing(on id: CentralID, now: Duration) {
        guard let link = links[id], let phone = link.connection.phoneKey, let code = link.pairingCode else { return }
        var outcome = ActionResult.Outcome.done
        // One phone per code: a second phone that handshook under it before the first
        // confirmed finds it used up.
        guard enrolment.confirmable(code.code, now: now) else {
            audit.audit(.notice, .pairingFailed, "pairing refused: phone \(phone.fingerprint): the code was used up or expired before it confirmed", phone: phone.fingerprint)
            guard var connection = links[id]?.connection else { return }
            let output = connection.finishAction(ActionResult(action: .pair, outcome: .failed))
            links[id]?.connection = connection
            return perform(output, for: id, now: now)
        }
        if let user = enrolment.paired(phone, code: code, now: now) {
            do {
                try registry.enrol(phone, user: user, name: "", by: "pairing code (admin)")
                audit.audit(.notice, .enrolled, "enrolled: phone \(phone.fingerprint) for user \(logSafe(user)) by an admin's pairing code", phone: phone.fingerprint, user: user)
                publishToFleet(phone, user: user, name: "")
            } catch {
                logger.error("cannot enrol phone \(phone.fingerprint): \(error)")
                outcome = .failed
            }
        } else {
            let scope = code.user.map { " for user \(logSafe($0))" } ?? ""
            audit.audit(.notice, .pairing, "paired: phone \(phone.fingerprint)\(scope); its first accepted login within \(config.pendingEnrolment) enrols it", phone: phone.fingerprint, user: code.user)
        }
        guard var connection = links[id]?.connection else { return }
        let output = connection.finishAction(ActionResult(action: .pair, outcome: outcome))
        links[id]?.connection = connection
        perform(output, for: id, now: now)
    }

    // MARK: - Login

    private func startLogin(_ push: CredentialPush, from id: CentralID, now: Duration) {
        guard let phone = links[id]?.connection.phoneKey else { return }
        let user = push.user
        let who = "phone \(phone.fingerprint) (\(logSafe(push.deviceName))) user \(logSafe(user))"
        let enrolledFor = enrolledUsers(of: phone)
        let pending = enrolment.pendingEnrolment(of: phone, now: now)
        guard enrolledFor.contains(user) || (pending != nil && (pending!.user == nil || pending!.user == user) && mayEnrol(user)) else {
            audit.audit(.notice, .pushRefused, "refused push: \(who): this phone is not enrolled for that user", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.wrongUser, reason: "this phone is not enrolled for \(user) at box \(identity.boxID)"), now: now)
            return
        }
        // The mode the push is for must be the user's: a key or escrow login goes only where the
        // box put the user in that mode, and a password pushed for a key or escrow user is refused
        // (those modes exist so that the phone holds no password).
        let kind = push.kind
        let sent: DaemonConfig.LoginMode = switch kind { case .password: .password; case .key: .key; case .escrow: .escrow }
        let mode = config.loginMode(for: user)
        // A key or escrow login has no password the box could check a pending phone by.
        guard sent == .password || enrolledFor.contains(user) else {
            audit.audit(.notice, .pushRefused, "refused \(sent) login: \(who): a \(sent) login needs a phone enrolled for that user", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.wrongUser, reason: "this phone is not enrolled for \(user) at box \(identity.boxID)"), now: now)
            return
        }
        guard sent == mode else {
            audit.audit(.notice, .pushRefused, "refused \(sent) login: \(who): the box is in \(mode) mode for this user", phone: phone.fingerprint, user: user)
            let reason = sent == .password
                ? "box \(identity.boxID) is in \(mode) mode for \(user): the phone must not hold the password (boxkey credentials set --\(mode == .key ? "key-only" : "escrow"))"
                : "box \(identity.boxID) does not take \(sent) logins for \(user) (it is in \(mode) mode)"
            finishLogin(on: id, LoginResult(.rejected, reason: reason), now: now)
            return
        }
        if rejectedByUser.isLimited(user, now: now) {
            audit.audit(.notice, .pushRefused, "refused push: \(who): too many rejected pushes for this user", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.rejected, reason: "too many rejected pushes for \(user); try later"), now: now)
            return
        }
        if !enrolledFor.contains(user), rejectedNewPhones.isLimited(Box.newPhones, now: now) {
            audit.audit(.notice, .pushRefused, "refused push: \(who): too many rejected pushes from new phones at this box", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.rejected, reason: "too many rejected pushes from new phones at box \(identity.boxID); try later"), now: now)
            return
        }
        switch prompts.choose(for: user) {
        case .prompt(let promptID) where kind == .key && !config.keyServices.contains(prompts[promptID]!.request.service):
            let service = prompts[promptID]!.request.service
            audit.audit(.notice, .pushRefused, "refused key login: \(who): \(logSafe(service)) does not take key logins ([login] key_services)", phone: phone.fingerprint, user: user, service: service)
            finishLogin(on: id, LoginResult(.rejected, reason: "the box's \(service) prompt does not take key logins"), now: now)
        case .none where config.logindUnlock && kind != .password:
            // Unlocking through logind checks a pushed password with the box's own service; key
            // and escrow logins go to prompts only.
            audit.audit(.notice, .pushRefused, "refused \(sent) login: \(who): box is not at a login prompt", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt"), now: now)
        case .none where config.logindUnlock:
            links[id]?.prompt = nil
            workContinuation.yield(.unlockThroughLogind(push, phone: phone, link: id))
        case .none:
            audit.audit(.notice, .pushRefused, "refused push: \(who): box is not at a login prompt", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt"), now: now)
        case .otherUser:
            audit.audit(.notice, .pushRefused, "refused push: \(who): the waiting prompt is for another user", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.wrongUser, reason: "the box's prompt is for another user"), now: now)
        case .namesNobody:
            audit.audit(.notice, .pushRefused, "refused push: \(who): the waiting prompt names no user yet", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.notAtPrompt, reason: "the box's prompt names no user yet: type \(user) there first"), now: now)
        case .ambiguous(let candidates):
            audit.audit(.notice, .pushRefused, "refused push: \(who): more than one prompt could take it (\(candidates.map(logSafe).joined(separator: "; ")))", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.ambiguousPrompt, reason: String("more than one prompt could take this push: \(candidates.joined(separator: "; "))".prefix(LoginResult.maxReasonLength))), now: now)
        case .prompt(let promptID) where prompts[promptID]!.offer.map { !($0.link == id && $0.user == user && $0.intent) } ?? false:
            // The person was asked about another phone (or has not answered yet): this prompt is not
            // free for any other push.
            audit.audit(.notice, .pushRefused, "refused push: \(who): the prompt shows another phone's proximity offer", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.ambiguousPrompt, reason: "the box's prompt is showing another phone's offer"), now: now)
        case .prompt(let promptID):
            // Escrow: the sealed copy opens with the phone's secret, or the person types the
            // password at this prompt to make one.
            var password = push.password
            var escrowUse: PromptTable.Escrow?
            if kind == .escrow, let secret = push.escrowSecret {
                if let sealed = escrow.sealed(phone: phone, user: user) {
                    do {
                        password = try EscrowSeal.open(sealed, secret: secret, boxKey: identity.keyPair.publicKey, phoneKey: phone, user: user)
                        escrowUse = .opened(password: password)
                    } catch {
                        // Not this phone's secret any more (the phone set a new one): the copy is useless.
                        try? escrow.destroy(phone: phone.fingerprint, user: user)
                        recordRejection(phone, user: user, now: now)
                        audit.audit(.notice, .pushRefused, "refused escrow login: \(who): the sealed password does not open with the phone's secret; destroyed it", phone: phone.fingerprint, user: user)
                        finishLogin(on: id, LoginResult(.rejected, reason: "the box's sealed copy does not open with this phone's secret: log in again with the password typed at the box, this phone near"), now: now)
                        return
                    }
                } else {
                    escrowUse = .capture(secret: secret)
                }
            }
            let ticket = registered.issueTicket(phone: phone, user: user, now: now)
            prompts[promptID]!.waiting = false
            let pendingPassword = enrolledFor.contains(user) ? nil : push.password
            prompts[promptID]!.verifying = .init(link: id, phone: phone, pendingPassword: pendingPassword, escrow: escrowUse, user: user,
                                                 name: push.deviceName, ticket: ticket)
            links[id]?.prompt = promptID
            let attempt = switch (kind, escrowUse) {
            case (.password, _): "login"
            case (.escrow, .capture?): "escrow capture"
            default: "\(sent) login"
            }
            audit.audit(.info, .loginAttempt, "\(attempt) attempt: \(who) into \(logSafe(prompts[promptID]!.description))", phone: phone.fingerprint, user: user, service: prompts[promptID]!.request.service)
            let answer: PromptAnswer = switch (kind, escrowUse) {
            case (.key, _): .keyLogin(user: user, ticket: ticket)
            case (.escrow, .capture?): .escrowCapture(user: user, ticket: ticket)
            default: .push(user: user, password: password, ticket: ticket)
            }
            if let offer = prompts[promptID]!.offer, offer.intent, offer.link == id, prompts[promptID]!.entered, waiters[promptID] != nil {
                // Enter was pressed at this phone's offer: its push is what the person asked for.
                deliver(answer, to: promptID, now: now)
            } else {
                // The module is inside the program's password prompt: the push waits for Enter
                // there, and the phone hears where.
                prompts[promptID]!.held = answer
                prompts[promptID]!.deadline = now + config.enterWait
                let place = prompts[promptID]!.description
                logger.info("push held at \(logSafe(place)) (pid \(prompts[promptID]!.pid)): waiting \(config.enterWait.components.seconds) s for Enter there")
                guard var connection = links[id]?.connection else { return }
                let output = connection.holdLogin(EnterWait(seconds: UInt16(clamping: config.enterWait.components.seconds), place: place))
                links[id]?.connection = connection
                perform(output, for: id, now: now)
            }
            readvertise()
        }
    }

    /// Hands a push to the module at `promptID` (Enter was pressed): the stack verifies it now.
    private func deliver(_ answer: PromptAnswer, to promptID: UInt64, now: Duration) {
        prompts[promptID]?.held = nil
        prompts[promptID]?.delivered = true
        prompts[promptID]?.entered = false
        prompts[promptID]?.deadline = now + config.outcomeTimeout
        waiters.removeValue(forKey: promptID)?.resume(returning: answer)
    }

    /// A held push that will not be delivered (no Enter in time, the prompt went on without the
    /// phone, the phone left): the phone hears why, its ticket is spent, and the prompt is open
    /// again. Not a rejection: nothing was verified.
    private func dropHeld(_ promptID: UInt64, _ outcome: LoginResult.Outcome, _ why: String, now: Duration) {
        guard let prompt = prompts[promptID], prompt.held != nil, let v = prompt.verifying else { return }
        prompts[promptID]!.held = nil
        prompts[promptID]!.verifying = nil
        prompts[promptID]!.deadline = nil
        prompts[promptID]!.waiting = true
        _ = registered.redeem(v.ticket, user: v.user, now: now)
        if links[v.link]?.prompt == promptID { links[v.link]?.prompt = nil }
        audit.audit(.notice, .loginRejected, "push not used: phone \(v.phone.fingerprint) user \(logSafe(v.user)) at \(logSafe(prompt.description)): \(why)",
                    phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
        finishLogin(on: v.link, LoginResult(outcome, reason: String(why.prefix(LoginResult.maxReasonLength))), now: now)
        readvertise()
    }

    // MARK: - Proximity

    /// An enrolled phone is near and offers to log `offer.user` in: the one prompt that may take
    /// that user shows it ("press Enter"), and nothing happens until the person asks there.
    private func startOffer(_ offer: ProximityOffer, from id: CentralID, now: Duration) {
        guard let phone = links[id]?.connection.phoneKey else { return }
        let user = offer.user
        let who = "phone \(phone.fingerprint) (\(logSafe(offer.deviceName))) user \(logSafe(user))"
        func refuse(_ outcome: LoginResult.Outcome, _ why: String, _ reason: String) {
            audit.audit(.notice, .pushRefused, "refused proximity offer: \(who): \(why)", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(outcome, reason: reason), now: now)
        }
        guard config.proximity else { return refuse(.notAtPrompt, "proximity login is off ([login] proximity)", "box \(identity.boxID) does not take proximity logins") }
        guard enrolledUsers(of: phone).contains(user) else {
            return refuse(.wrongUser, "a proximity offer needs a phone enrolled for that user", "this phone is not enrolled for \(user) at box \(identity.boxID)")
        }
        guard !rejectedByUser.isLimited(user, now: now) else { return refuse(.rejected, "too many rejected pushes for this user", "too many rejected pushes for \(user); try later") }
        // The program's password prompt is on the screen before any offer comes, so the prompt
        // cannot say whose phone is near: only a prompt already for this user (its login name
        // typed, its user chosen at the greeter, its locker) takes an offer.
        let choice = prompts.choose(for: user)
        if choice == .namesNobody {
            return refuse(.notAtPrompt, "the prompt names no user", "the box's prompt names no user yet: type \(user) there first")
        }
        guard case .prompt(let promptID) = choice else {
            return refuse(.notAtPrompt, "no single prompt waits for this user", "box \(identity.boxID) is not at a login prompt for \(user)")
        }
        guard prompts[promptID]!.offer == nil else {
            return refuse(.ambiguousPrompt, "the prompt already shows another phone's offer", "the box's prompt is showing another phone's offer")
        }
        guard !offersByPhone.isLimited(phone, now: now) else {
            return refuse(.rejected, "\(Box.offersPerPhone) offers in 5 minutes", "too many proximity offers from this phone; try later or use boxkey login")
        }
        offersByPhone.record(phone, now: now)
        // The prompt stays open: another phone's push or offer there is refused by name.
        prompts[promptID]!.offer = .init(link: id, phone: phone, user: user)
        // The person's time to see it and press Enter.
        prompts[promptID]!.deadline = now + config.maxPromptWait
        links[id]?.prompt = promptID
        audit.audit(.info, .loginAttempt, "proximity offer: \(who) at \(logSafe(prompts[promptID]!.description)) (pid \(prompts[promptID]!.pid)); waiting for Enter there", phone: phone.fingerprint, user: user, service: prompts[promptID]!.request.service)
        readvertise()
        wakeTimers()
    }

    /// The person pressed Enter at a prompt holding an offer: the phone pushes now, and the
    /// prompt takes that push at once. False when the offering phone is gone.
    private func giveIntent(_ promptID: UInt64, now: Duration) -> Bool {
        guard var offer = prompts[promptID]?.offer, !offer.intent, var link = links[offer.link] else {
            prompts[promptID]?.offer = nil
            prompts[promptID]?.waiting = prompts[promptID]?.verifying == nil
            return false
        }
        offer.intent = true
        prompts[promptID]!.offer = offer
        prompts[promptID]!.waiting = true
        prompts[promptID]!.deadline = now + config.commandTimeout
        audit.audit(.info, .loginAttempt, "proximity intent: Enter pressed at \(logSafe(prompts[promptID]!.description)) for phone \(offer.phone.fingerprint) user \(logSafe(offer.user))", phone: offer.phone.fingerprint, user: offer.user)
        let output = link.connection.giveIntent(now: now)
        links[offer.link] = link
        perform(output, for: offer.link, now: now)
        return true
    }

    /// A prompt with an offer went away (timed out, cancelled, another took its place): the
    /// offering phone hears so, unless it already pushed.
    private func withdrawOffer(of promptID: UInt64, _ why: String) {
        guard let offer = prompts[promptID]?.offer, prompts[promptID]?.verifying == nil else { return }
        prompts[promptID]!.offer = nil
        prompts[promptID]!.waiting = true
        prompts[promptID]!.deadline = nil
        finishLogin(on: offer.link, LoginResult(.notAtPrompt, reason: why), now: clock.now)
        readvertise()
    }

    /// No prompt waits, but a screen locker running as the user may: if logind says the user
    /// has exactly one locked local session, verify the pushed password through the box's own
    /// PAM service and unlock that session through logind (`[unlock]`).
    private func unlockThroughLogind(_ push: CredentialPush, phone: PublicKey, on id: CentralID) async {
        let user = push.user
        let who = "phone \(phone.fingerprint) (\(logSafe(push.deviceName))) user \(logSafe(user))"
        func finish(_ result: LoginResult) { finishLogin(on: id, result, now: clock.now) }
        guard let uid = uid(of: user) else {
            audit.audit(.notice, .pushRefused, "refused push: \(who): no such user", phone: phone.fingerprint, user: user)
            return finish(LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt"))
        }
        let locked: [LoginSession]
        do { locked = try await sessions.sessions(ofUID: uid).filter { $0.isLocal && $0.locked && $0.sessionClass == "user" } } catch {
            audit.audit(.warning, .pushRefused, "refused push: \(who): logind did not answer (\(error))", phone: phone.fingerprint, user: user)
            return finish(LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt"))
        }
        guard let session = locked.first else {
            audit.audit(.notice, .pushRefused, "refused push: \(who): box is not at a login prompt and \(logSafe(user)) has no locked local session", phone: phone.fingerprint, user: user)
            return finish(LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt"))
        }
        guard locked.count == 1 else {
            audit.audit(.notice, .pushRefused, "refused push: \(who): \(locked.count) locked sessions could take it", phone: phone.fingerprint, user: user)
            return finish(LoginResult(.ambiguousPrompt, reason: String("more than one locked session: \(locked.map(\.place).joined(separator: "; "))".prefix(LoginResult.maxReasonLength))))
        }
        let place = "session \(session.id) (\(session.place))"
        audit.audit(.info, .loginAttempt, "login attempt: \(who) into \(logSafe(config.verifyService)) to unlock \(logSafe(place)) through logind", phone: phone.fingerprint, user: user, service: config.verifyService)
        let verdict = await PAMVerifier(service: config.verifyService).verify(user: user, password: push.password)
        let now = clock.now
        guard verdict == .accepted else {
            recordRejection(phone, user: user, now: now)
            let reason = if case .rejected(let r) = verdict { r } else { "" }
            audit.audit(.notice, .loginRejected, "login rejected: \(who) via \(logSafe(config.verifyService)): \(logSafe(reason))", phone: phone.fingerprint, user: user, service: config.verifyService)
            return finish(LoginResult(.rejected, reason: reason.isEmpty ? "the password was not accepted" : String(reason.prefix(LoginResult.maxReasonLength))))
        }
        do { try await sessions.unlock(session: session.id) } catch {
            logger.error("logind did not unlock \(logSafe(place)): \(error)")
            return finish(LoginResult(.timedOut, reason: "the password was accepted, but logind did not unlock the session"))
        }
        audit.audit(.info, .loginAccepted, "login accepted: \(who) via \(logSafe(config.verifyService)); unlocked \(logSafe(place)) through logind", phone: phone.fingerprint, user: user, service: config.verifyService)
        credit(phone, user: user, name: push.deviceName, on: id, session: session, service: config.verifyService, now: now)
        finish(LoginResult(.accepted, reason: String("\(place) unlocked through logind".prefix(LoginResult.maxReasonLength))))
        readvertise()
    }

    /// What an accepted push earns, and only that: enrolment of a pending phone for this user,
    /// the login on record, the session it unlocked bound to the phone, and its presence link.
    private func credit(_ phone: PublicKey, user: String, name: String, on link: CentralID, session: LoginSession?,
                        service: String, now: Duration) {
        if !enrolledUsers(of: phone).contains(user), mayEnrol(user) {
            do {
                try registry.enrol(phone, user: user, name: name, by: "pairing code")
                audit.audit(.notice, .enrolled, "enrolled: phone \(phone.fingerprint) (\(logSafe(name))) for user \(logSafe(user)) by its first login under a pairing code", phone: phone.fingerprint, user: user)
                publishToFleet(phone, user: user, name: name)
            } catch {
                logger.error("cannot enrol phone \(phone.fingerprint): \(error)")
            }
        }
        enrolment.settle(phone)
        try? registry.recordLogin(phone, name: name)
        if let session { registered.register(session, service: service, phone: phone) }
        lockedUsers.remove(user)
        if links[link] != nil {
            presences[link] = startedPresence(phone: phone, user: user, now: now)
            graces[phone] = nil
        } else {
            // The phone left between its push and the verdict: no presence link holds this
            // session, so it is treated as walked away (the grace lets the phone come back).
            startGrace(phone: phone, user: user, reason: "link lost before the login was accepted", now: now)
        }
    }

    /// A push the stack did not accept from this phone counts against the phone, and against
    /// the user only if the phone is enrolled for that user. New phones (pending, paired with a
    /// code read off the screen) share one budget of their own at this box, so no number of them
    /// can spend an enrolled user's.
    private func recordRejection(_ phone: PublicKey, user: String, now: Duration) {
        rejectedByPhone.record(phone, now: now)
        if enrolledUsers(of: phone).contains(user) {
            rejectedByUser.record(user, now: now)
        } else {
            rejectedNewPhones.record(Box.newPhones, now: now)
        }
    }

    private func finishLogin(on id: CentralID, _ result: LoginResult, now: Duration) {
        guard var connection = links[id]?.connection else { return }
        let output = connection.finishLogin(result)
        links[id]?.connection = connection
        perform(output, for: id, now: now)
    }

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
        guard config.phoneLoginServices.contains(request.service) else {
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
        let now = clock.now
        let (id, superseded) = prompts.add(request, owner: owner, pid: peer.pid)
        for other in superseded { closePrompt(other, .superseded, now: now) }
        let code = enrolment.codeForPrompt(user: request.expectedUser.isEmpty ? nil : request.expectedUser, now: now)
        logger.info("login prompt waiting: \(logSafe(prompts[id]!.description))\(request.expectedUser.isEmpty ? "" : " for \(logSafe(request.expectedUser))") (pid \(peer.pid))")
        readvertise()
        wakeTimers()
        let seconds = code.map { UInt32(max(0, ($0.expires - now).components.seconds)) } ?? 0
        return (id, .prompt(boxID: identity.boxID.description, fingerprint: identity.fingerprint, pairingCode: code?.code.text ?? "", codeSeconds: seconds))
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
        let now = clock.now
        guard let prompt = prompts[id] else { return .noPush(.superseded) }
        if let held = prompt.held {
            deliver(held, to: id, now: now)
            readvertise()
            return held
        }
        guard waiters[id] == nil, prompt.verifying == nil else { return .noPush(.timedOut) }
        // Only a phone that offered here is waited for: a connection alone says nothing about
        // whose push would come (anyone in range can open one), so Enter with no push or offer
        // here is answered at once.
        guard prompt.offer != nil, giveIntent(id, now: now) else { return .noPush(.nothingYet) }
        prompts[id]!.deadline = now + min(wait, config.maxPromptWait, config.commandTimeout)
        logger.info("Enter at \(logSafe(prompt.description)): the offering phone pushes now")
        prompts[id]!.entered = true
        wakeTimers()
        // Shutting down (or the connection's task ending) releases the wait at once.
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<PromptAnswer, Never>) in
                guard prompts[id]?.entered == true, !Task.isCancelled else {
                    c.resume(returning: .noPush(.shuttingDown))
                    return
                }
                waiters[id] = c
            }
        } onCancel: {
            Task { await self.endWait(id, .shuttingDown) }
        }
    }

    /// The module has a delivered push: its next requests are about that push.
    public func hasPush(_ id: UInt64) -> Bool { prompts[id]?.delivered == true }

    /// Ends an Enter's wait for a phone that did not push; the prompt stays open.
    private func endWait(_ id: UInt64, _ reason: PAMReply.NoPushReason) {
        guard let waiter = waiters.removeValue(forKey: id) else { return }
        if prompts[id]?.entered == true {
            prompts[id]!.entered = false
            if prompts[id]!.verifying == nil { prompts[id]!.deadline = nil }
            if let offer = prompts[id]!.offer, offer.intent, prompts[id]!.verifying == nil { prompts[id]!.offer = nil }
        }
        waiter.resume(returning: .noPush(reason))
    }

    /// A prompt ends before its push was delivered (another took its place, shutdown): what
    /// waited on it hears so.
    private func closePrompt(_ id: UInt64, _ reason: PAMReply.NoPushReason, now: Duration) {
        guard let prompt = prompts[id], !prompt.delivered else { return }
        withdrawOffer(of: id, "the box's login prompt went away before Enter was pressed")
        dropHeld(id, .notAtPrompt, "the box's login prompt went away before Enter was pressed there", now: now)
        endWait(id, reason)
        prompts.remove(id)
        readvertise()
    }

    /// The module is done with the prompt without a delivered push (the person typed a
    /// password, cancelled, or its process ended), or its connection closed.
    public func promptClosed(_ id: UInt64) async {
        guard let prompt = prompts[id] else { return }
        if prompt.delivered, prompt.verifying != nil {
            // The stack ended without a report (the application died): tell the phone no.
            await report(id, .rejected, reason: "the login was abandoned")
            prompts.remove(id)
            return
        }
        let now = clock.now
        withdrawOffer(of: id, "the box's login prompt went on without the phone before Enter was pressed")
        dropHeld(id, .notAtPrompt, "the box's login prompt went on without the phone (a password was typed there, or it closed) before Enter was pressed", now: now)
        endWait(id, .timedOut)
        prompts.remove(id)
        readvertise()
    }

    /// The PAM stack's verdict on a push. Credit — "accepted", enrolment, a presence link —
    /// only when the password the stack verified is the one the phone pushed.
    public func report(_ id: UInt64, _ verdict: PAMRequest.Verdict, reason: String) async {
        guard let prompt = prompts[id], let v = prompt.verifying else { return }
        prompts.remove(id)
        let who = "phone \(v.phone.fingerprint) (\(logSafe(v.name))) user \(logSafe(v.user)) via \(logSafe(prompt.description))"
        if case .capture(let secret)? = v.escrow {
            await finishCapture(prompt, v, secret: secret, verdict: verdict, who: who)
            return
        }
        if case .opened(let password)? = v.escrow, verdict != .accepted {
            _ = registered.redeem(v.ticket, user: v.user, now: clock.now)
            recordRejection(v.phone, user: v.user, now: clock.now)
            // Stale only if the box's own password-only service refuses it too: the stack's
            // "no" may be a locked account, a directory outage, a cancelled or one-time-code prompt.
            let check = await PAMVerifier(service: config.verifyService).verify(user: v.user, password: password)
            if case .rejected(let why) = check {
                try? escrow.destroy(phone: v.phone.fingerprint, user: v.user)
                audit.audit(.notice, .loginRejected, "escrow login rejected: \(who): \(logSafe(reason)); \(logSafe(config.verifyService)) refuses the sealed password too (\(logSafe(why))): destroyed it", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
                finishLogin(on: v.link, LoginResult(.rejected, reason: "the sealed password was not accepted (changed?): log in once with it typed at the box, this phone near"), now: clock.now)
            } else {
                audit.audit(.notice, .loginRejected, "escrow login not accepted: \(who): \(logSafe(reason)); the sealed password still checks out, kept", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
                finishLogin(on: v.link, LoginResult(.rejected, reason: reason.isEmpty ? "the login was not accepted" : String(reason.prefix(LoginResult.maxReasonLength))), now: clock.now)
            }
            return
        }
        var verdict = verdict
        if verdict == .accepted, let password = v.pendingPassword {
            // A pending phone is enrolled only once the box itself confirms its password.
            let check = await PAMVerifier(service: config.verifyService).verify(user: v.user, password: password)
            if case .rejected(let why) = check {
                audit.audit(.notice, .loginRejected, "not enrolling: \(who): the box's own check (\(logSafe(config.verifyService))) did not confirm the pushed password: \(logSafe(why))", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
                verdict = .acceptedOther
            }
        }
        let now = clock.now
        if verdict == .accepted, registry.isRevoked(v.phone)
            || (!enrolledUsers(of: v.phone).contains(v.user) && enrolment.pendingEnrolment(of: v.phone, now: now) == nil) {
            // Revoked while the stack or the box's own check ran: no credit, no presence link.
            audit.audit(.notice, .loginRejected, "login completed, but phone \(v.phone.fingerprint) was revoked meanwhile: \(who); no credit", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
            _ = registered.redeem(v.ticket, user: v.user, now: now)
            finishLogin(on: v.link, LoginResult(.rejected, reason: "this phone was revoked at box \(identity.boxID)"), now: now)
            return
        }
        switch verdict {
        case .accepted:
            audit.audit(.info, .loginAccepted, "login accepted: \(who)", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
            // A locker in the user's own session: that session is the one this push unlocked.
            let own = prompt.owner.flatMap { $0.sessionClass != "greeter" && $0.user == v.user ? $0 : nil }
            credit(v.phone, user: v.user, name: v.name, on: v.link, session: own, service: prompt.request.service, now: now)
            finishLogin(on: v.link, LoginResult(.accepted, reason: String(prompt.description.prefix(LoginResult.maxReasonLength))), now: now)
            readvertise()
        case .acceptedOther:
            audit.audit(.notice, .loginRejected, "login completed without the phone's password: \(who); the phone gets no credit", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
            _ = registered.redeem(v.ticket, user: v.user, now: now)
            recordRejection(v.phone, user: v.user, now: now)
            finishLogin(on: v.link, LoginResult(.rejected, reason: "the box logged in with a password typed at the keyboard, not the one this phone pushed"), now: now)
        case .rejected:
            _ = registered.redeem(v.ticket, user: v.user, now: now)
            recordRejection(v.phone, user: v.user, now: now)
            audit.audit(.notice, .loginRejected, "login rejected: \(who): \(logSafe(reason))", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
            finishLogin(on: v.link, LoginResult(.rejected, reason: reason.isEmpty ? "the password was not accepted" : String(reason.prefix(LoginResult.maxReasonLength))), now: now)
        }
    }

    /// The module's copy of the password typed at an escrow capture prompt (before its report).
    public func captured(_ id: UInt64, password: SecureBytes) {
        guard case .capture? = prompts[id]?.verifying?.escrow else { return }
        prompts[id]!.verifying!.captured = password
    }

    /// An escrow capture ended: the person typed the password with the phone present. Sealed
    /// only when the stack accepted the login and the box's own service confirms the typed
    /// password is the user's; then the phone gets the login's credit.
    private func finishCapture(_ prompt: PromptTable.Prompt, _ v: PromptTable.Verifying, secret: SecureBytes,
                               verdict: PAMRequest.Verdict, who: String) async {
        let service = prompt.request.service
        func refuse(_ why: String, _ reason: String) {
            // A failed capture counts like a rejected push: an enrolled phone cannot take over
            // prompts with "type the password" without limit.
            recordRejection(v.phone, user: v.user, now: clock.now)
            _ = registered.redeem(v.ticket, user: v.user, now: clock.now)
            audit.audit(.notice, .loginRejected, "not sealing: \(who): \(why)", phone: v.phone.fingerprint, user: v.user, service: service)
            finishLogin(on: v.link, LoginResult(.rejected, reason: reason), now: clock.now)
        }
        guard verdict != .rejected else { return refuse("the login was not accepted", "the login at the box was not accepted; nothing was sealed") }
        guard let password = v.captured else {
            return refuse("the stack accepted the login without a typed password", "the box logged in without a typed password; nothing was sealed")
        }
        let check = await PAMVerifier(service: config.verifyService).verify(user: v.user, password: password)
        if case .rejected(let why) = check {
            return refuse("the box's own check (\(logSafe(config.verifyService))) did not confirm the typed password: \(logSafe(why))",
                          "the box could not confirm the typed password; nothing was sealed")
        }
        // Revoked (or unenrolled) while the check ran: nothing is sealed for it.
        guard enrolledUsers(of: v.phone).contains(v.user) else {
            return refuse("phone \(v.phone.fingerprint) was revoked while the password was checked", "this phone was revoked at box \(identity.boxID); nothing was sealed")
        }
        let sealed = EscrowSeal.seal(password: password, secret: secret, boxKey: identity.keyPair.publicKey, phoneKey: v.phone, user: v.user)
        do { try escrow.keep(sealed, phone: v.phone, user: v.user) } catch {
            logger.error("cannot keep the sealed password: \(error)")
            return refuse("cannot write the sealed copy (\(error))", "the box could not store the sealed password")
        }
        let now = clock.now
        audit.audit(.notice, .loginAccepted, "login accepted: \(who); the typed password is sealed for this phone (escrow)", phone: v.phone.fingerprint, user: v.user, service: service)
        let own = prompt.owner.flatMap { $0.sessionClass != "greeter" && $0.user == v.user ? $0 : nil }
        credit(v.phone, user: v.user, name: v.name, on: v.link, session: own, service: service, now: now)
        finishLogin(on: v.link, LoginResult(.accepted, reason: String("\(prompt.description); password sealed for this phone".prefix(LoginResult.maxReasonLength))), now: now)
        readvertise()
    }

    /// `pam_sm_open_session`: registers the session only if logind says it is a local session
    /// of that user's uid; the ticket binds it to the phone whose push opened it.
    public func openSession(user: String, sessionID: String, service: String, ticket: String) async {
        let what = "session \(logSafe(sessionID)) for \(logSafe(user)) by \(logSafe(service))"
        guard let uid = uid(of: user) else {
            audit.audit(.notice, .sessionRefused, "refused to register \(what): no such user", user: user, service: service)
            return
        }
        let session: LoginSession?
        do { session = try await sessions.session(id: sessionID) } catch {
            audit.audit(.warning, .sessionRefused, "refused to register \(what): logind did not answer (\(error))", user: user, service: service)
            return
        }
        guard let session else { audit.audit(.notice, .sessionRefused, "refused to register \(what): logind does not know it", user: user, service: service); return }
        guard session.uid == uid else {
            audit.audit(.warning, .sessionRefused, "refused to register \(what): logind says it belongs to uid \(session.uid), not \(uid)", user: user, service: service)
            return
        }
        guard session.isLocal else {
            logger.info("not registering \(what): not a local session")
            return
        }
        let phone = registered.redeem(ticket, user: user, now: clock.now)
        registered.register(session, service: service, phone: phone)
        audit.audit(.info, .sessionRegistered, "session \(logSafe(sessionID)) (\(logSafe(user)), \(logSafe(session.place))) registered by \(logSafe(service))\(phone.map { " for phone \($0.fingerprint)" } ?? "")",
                    phone: phone?.fingerprint, user: user, service: service)
    }

    public func closeSession(sessionID: String) {
        registered.close(sessionID)
    }

    // MARK: - Lock, logout, attach, walk-away

    /// Runs one job a decision queued (`BoxWork`).
    func run(_ job: BoxWork) async {
        switch job {
        case .act(let action, let id): await act(action, for: id)
        case .unlockThroughLogind(let push, let phone, let id): await unlockThroughLogind(push, phone: phone, on: id)
        case .settle(let locked, let phone, let endable): await settle(await unconfirmedLocks(locked), phone: phone, endable: endable)
        }
    }

    private func act(_ action: ActionResult.Action, for id: CentralID) async {
        guard let phone = links[id]?.connection.phoneKey else { return }
        let users = enrolledUsers(of: phone)
        var outcome: ActionResult.Outcome = .noSession
        if users.isEmpty {
            audit.audit(.notice, .pushRefused, "refused \(action) from phone \(phone.fingerprint): not enrolled", phone: phone.fingerprint)
        } else {
            let bound = registered.sessions(boundTo: phone)
            let known = users.flatMap { registered.sessions(of: $0) }
            let targets = bound.isEmpty ? known : bound
            switch action {
            case .lock:
                // Lock is harmless: when unsure which session, lock all of the users' local ones.
                outcome = await lock(targets, orAllOf: users, phone: phone, reason: "phone asked", walkAway: false)
                // Presence ends only with what it guards: a lock that did not happen leaves the
                // session open, and walking away must still act on it.
                if outcome == .done {
                    lockedUsers.formUnion(users)
                    endPresence(of: phone, except: id)
                }
            case .logout:
                if targets.isEmpty {
                    audit.audit(.notice, .pushRefused, "refused logout from phone \(phone.fingerprint): no session on record for \(users.map(logSafe).joined(separator: ", "))", phone: phone.fingerprint)
                } else {
                    outcome = await run("logout", targets, phone: phone, reason: "phone asked") { try await self.sessions.terminate(session: $0) }
                    if outcome == .done {
                        for s in targets { registered.close(s.id) }
                        endPresence(of: phone, except: id)
                    }
                }
            case .attach:
                // Attach only restores walk-away protection; it unlocks nothing. A session on
                // record, or (after a daemon restart forgot them) a local one logind lists.
                var candidate = users.first { !lockedUsers.contains($0) && !registered.sessions(of: $0).isEmpty }
                if candidate == nil {
                    for user in users where !lockedUsers.contains(user) {
                        guard let uid = uid(of: user), let live = try? await sessions.sessions(ofUID: uid),
                              live.contains(where: { $0.isLocal && !$0.locked }) else { continue }
                        candidate = user
                        break
                    }
                }
                if let user = candidate {
                    graces[phone] = nil
                    presences[id] = startedPresence(phone: phone, user: user, now: clock.now)
                    audit.audit(.info, .presence, "presence link back: phone \(phone.fingerprint) user \(logSafe(user))", phone: phone.fingerprint, user: user)
                    outcome = .done
                } else {
                    audit.audit(.notice, .pushRefused, "refused attach from phone \(phone.fingerprint): no unlocked session on record", phone: phone.fingerprint)
                }
            case .pair:
                break
            }
        }
        guard var connection = links[id]?.connection else { return }
        let output = connection.finishAction(ActionResult(action: action, outcome: outcome))
        links[id]?.connection = connection
        perform(output, for: id, now: clock.now)
        readvertise()
    }

    /// After an explicit lock or logout the phone's presence links have nothing left to guard.
    /// The phone's presence ends (no walk-away follows). Its links are dropped, except `asker`:
    /// a lock asked for over the presence link itself is answered on it (the phone closes it).
    private func endPresence(of phone: PublicKey, except asker: CentralID) {
        for (id, p) in presences where p.phone == phone {
            presences[id] = nil
            if id != asker { drop(id) }
        }
        graces[phone] = nil
    }

    private func run(_ what: String, _ targets: [LoginSession], phone: PublicKey, reason: String,
                     _ body: @Sendable (String) async throws -> Void) async -> ActionResult.Outcome {
        var done = 0
        for s in targets {
            do {
                try await body(s.id)
                audit.audit(.notice, .sessionAction, "\(what): session \(logSafe(s.id)) (\(logSafe(s.place))) user \(logSafe(s.user)) phone \(phone.fingerprint) (\(reason))", phone: phone.fingerprint, user: s.user)
                done += 1
            } catch {
                logger.error("\(what) of session \(logSafe(s.id)) failed: \(error)")
            }
        }
        return done > 0 ? .done : .failed
    }

    /// Locks `targets`; with none on record, every local session of `users` that logind
    /// lists — walk-away fails closed. A session that does not then say it is locked
    /// (LockedHint) within `lock_confirm_s` has nothing on it that follows logind's Lock: after a
    /// walk-away one of `targets` (sessions this phone opened or unlocked) is ended
    /// (`[presence] not_locked = logout`, the default) or kept and logged (`keep`); one found only
    /// by the fail-closed search is never ended, only logged. An explicit lock that locked
    /// nothing reports a failure to the phone.
    private func lock(_ targets: [LoginSession], orAllOf users: [String], phone: PublicKey, reason: String, walkAway: Bool) async -> ActionResult.Outcome {
        var list = targets
        let endable = walkAway ? Set(targets.map(\.id)) : []
        if list.isEmpty {
            for user in users {
                guard let uid = uid(of: user) else { continue }
                do { list += try await sessions.sessions(ofUID: uid).filter(\.isLocal) } catch {
                    audit.audit(.error, .sessionAction, "cannot list the sessions of \(logSafe(user)) to lock them: \(error)")
                }
            }
            audit.audit(.notice, .sessionAction, "no session on record for \(users.map(logSafe).joined(separator: ", ")): locking all \(list.count) local session(s)", phone: phone.fingerprint)
        }
        guard !list.isEmpty else { return .noSession }
        let outcome = await run(walkAway ? "walk-away lock" : "lock", list, phone: phone, reason: reason) { try await self.sessions.lock(session: $0) }
        guard outcome == .done else { return outcome }
        if walkAway {
            // Nobody waits for the answer: the timers carry on while the sessions are checked.
            workContinuation.yield(.settle(locked: list, phone: phone, endable: endable))
            return outcome
        }
        let open = await unconfirmedLocks(list)
        await settle(open, phone: phone, endable: [])
        return open.count == list.count ? .failed : outcome
    }

    /// logind's LockSession only signals the session: the sessions of `list` that logind says
    /// are still not locked (`LockedHint` false) `lock_confirm_s` later. A session logind did not
    /// answer for at the end is not among them: an outage is not proof that nothing locked it.
    private func unconfirmedLocks(_ list: [LoginSession]) async -> [LoginSession] {
        let deadline = clock.now + config.lockConfirm
        var open = list
        var unanswered: [String] = []
        while true {
            var still: [LoginSession] = []
            unanswered = []
            for s in open {
                switch await lockedHint(s.id) {
                case true?: break
                case false?: still.append(s)
                case nil: still.append(s); unanswered.append(s.id)
                }
            }
            open = still
            guard !open.isEmpty, clock.now < deadline else { break }
            try? await clock.sleep(for: .milliseconds(100))
        }
        if !unanswered.isEmpty {
            audit.audit(.warning, .sessionAction, "logind did not answer whether session(s) \(unanswered.map(logSafe).joined(separator: ", ")) locked: not acting on them")
        }
        return open.filter { !unanswered.contains($0.id) }
    }

    /// logind's LockedHint of a session; nil when logind did not answer. A session that is gone
    /// needs nothing more.
    private func lockedHint(_ id: String) async -> Bool? {
        do { return try await sessions.session(id: id)?.locked ?? true } catch { return nil }
    }

    /// Sessions a lock did not lock: those in `endable` (after a walk-away, the sessions this
    /// phone opened) are ended unless `not_locked = keep`; every one is said loudly.
    private func settle(_ open: [LoginSession], phone: PublicKey, endable: Set<String>) async {
        let seconds = config.lockConfirm.components.seconds
        for s in open {
            let what = "session \(logSafe(s.id)) (\(logSafe(s.user)), \(logSafe(s.place))) did not report itself locked \(seconds) s after LockSession (LockedHint false): nothing on it follows logind's Lock — a text console, or a desktop without a logind-aware locker"
            guard endable.contains(s.id), config.notLocked == .logout else {
                let why = endable.contains(s.id) ? " ([presence] not_locked = keep)" : endable.isEmpty ? "" : " (not a session this phone opened: never ended for it)"
                audit.audit(.error, .sessionAction, "\(what); it is still open\(why)", phone: phone.fingerprint, user: s.user)
                continue
            }
            do {
                try await sessions.terminate(session: s.id)
                registered.close(s.id)
                audit.audit(.notice, .sessionAction, "\(what): ended it ([presence] not_locked = logout)", phone: phone.fingerprint, user: s.user)
            } catch {
                audit.audit(.error, .sessionAction, "\(what), and ending it failed: \(error); it may still be open", phone: phone.fingerprint, user: s.user)
            }
        }
    }

    private func startGrace(phone: PublicKey, user: String, reason: String, now: Duration) {
        guard config.policy != .none else { return }
        graces[phone] = Grace(user: user, deadline: now + config.grace, reason: reason)
        wakeTimers()
    }

    private func walkAway(phone: PublicKey, user: String, reason: String) async {
        let bound = registered.sessions(boundTo: phone)
        switch config.policy {
        case .lock:
            if await lock(bound, orAllOf: [user], phone: phone, reason: reason, walkAway: true) == .done { lockedUsers.insert(user) }
        case .logout:
            if bound.isEmpty {
                // Unsure which session: lock them all rather than end one by guess.
                if await lock([], orAllOf: [user], phone: phone, reason: reason, walkAway: true) == .done { lockedUsers.insert(user) }
            } else if await run("walk-away logout", bound, phone: phone, reason: reason, { try await self.sessions.terminate(session: $0) }) == .done {
                for s in bound { registered.close(s.id) }
            }
        case .none:
            break
        }
    }

    /// A revoked phone's live links end, but those of a presence link for one of `users` (the
    /// users it keeps). A presence link that ends so ends as a walk-away does (the policy's lock
    /// or logout, at once): nothing guards its session any more.
    func endLinks(of phone: PublicKey, keeping users: [String] = [], reason: String) async {
        var away: [String] = []
        for (id, link) in links where link.connection.phoneKey == phone {
            let user = presences[id]?.user
            guard users.isEmpty || user.map({ !users.contains($0) }) == true else { continue }
            if let user {
                away.append(user)
                audit.audit(.notice, .sessionAction, "presence link of phone \(phone.fingerprint) user \(logSafe(user)) ended: \(reason)", phone: phone.fingerprint, user: user)
            }
            presences[id] = nil
            drop(id)
        }
        guard !away.isEmpty else { return }
        readvertise()
        for user in away { await walkAway(phone: phone, user: user, reason: reason) }
    }

    /// A new presence link: the presence service starts reading its RSSI.
    private func startedPresence(phone: PublicKey, user: String, now: Duration) -> PresenceMonitor {
        presenceChanged.signal()
        wakeTimers()
        return PresenceMonitor(phone: phone, user: user, settings: presenceSettings, now: now)
    }

    var presenceSettings: PresenceMonitor.Settings {
        .init(keepaliveTimeout: config.keepaliveTimeout, rssiInterval: config.rssiInterval, samples: config.rssiSamples,
              lockThreshold: config.rssiLockThreshold, returnThreshold: config.rssiReturnThreshold, awayAfter: config.awayAfter)
    }

    /// An RSSI reading of a presence link (nil: the read failed, which is no sample).
    public func rssiSample(_ id: CentralID, _ rssi: Int?, now: Duration) async {
        presences[id]?.sample(rssi, now: now)
        await checkPresence(id, now: now)
    }

    private func checkPresence(_ id: CentralID, now: Duration) async {
        guard let p = presences[id], let why = p.away(now: now) else { return }
        presences[id] = nil
        audit.audit(.notice, .sessionAction, "walked away: phone \(p.phone.fingerprint) user \(logSafe(p.user)): \(why)", phone: p.phone.fingerprint, user: p.user)
        drop(id)
        readvertise()
        await walkAway(phone: p.phone, user: p.user, reason: why)
    }

    // MARK: - Time

    /// Runs every timeout that is due (handshakes, prompts, grace periods, keepalives).
    public func tick() async {
        ticking = true
        ticks += 1
        defer { ticking = false }
        let now = clock.now
        failedHandshakes.pruneAll(now: now)
        rejectedByPhone.pruneAll(now: now)
        rejectedByUser.pruneAll(now: now)
        rejectedNewPhones.pruneAll(now: now)
        for id in Array(links.keys) {
            guard var link = links[id], !link.dropped else { continue }
            do { try link.reassembler.checkTimeout(now: now) } catch {
                links[id] = link
                audit.audit(.notice, .connectionRefused, "dropped \(id.address): stalled mid-message")
                failedHandshakes.record(id.address, now: now)
                drop(id)
                continue
            }
            let output = link.connection.tick(now: now)
            links[id] = link
            perform(output, for: id, now: now)
        }
        for prompt in prompts.prompts.values {
            guard let deadline = prompt.deadline, deadline <= now else { continue }
            if prompt.entered {
                // Enter was pressed, and the phone on its way (or asked by its offer) did not push.
                endWait(prompt.id, .timedOut)
            } else if prompt.held != nil {
                dropHeld(prompt.id, .timedOut, "nobody pressed Enter at \(prompt.description) within \(config.enterWait.components.seconds) s", now: now)
            } else if prompt.delivered, let v = prompt.verifying {
                prompts.remove(prompt.id)
                finishLogin(on: v.link, LoginResult(.timedOut, reason: "the login prompt did not report an outcome"), now: now)
            } else if prompt.offer != nil {
                withdrawOffer(of: prompt.id, "nobody pressed Enter at the box's prompt")
            } else {
                prompts[prompt.id]?.deadline = nil
            }
        }
        for (phone, grace) in graces where grace.deadline <= now {
            graces[phone] = nil
            await walkAway(phone: phone, user: grace.user, reason: grace.reason)
        }
        for id in Array(presences.keys) { await checkPresence(id, now: now) }
    }

    /// The presence links whose RSSI should be read now (`PresenceService`).
    public func presenceReadsDue() -> [CentralID] {
        let now = clock.now
        return presences.filter { $0.value.nextSample <= now }.map(\.key)
    }

    public func nextPresenceRead() -> Duration? { presences.values.map(\.nextSample).min() }

    /// The earliest time anything needs attention, or nil when the box is idle.
    public func nextDeadline() -> Duration? {
        var deadlines: [Duration] = []
        for link in links.values where !link.dropped {
            if let d = link.connection.nextDeadline { deadlines.append(d) }
            if let d = link.reassembler.deadline { deadlines.append(d) }
        }
        deadlines += prompts.prompts.values.compactMap(\.deadline)
        deadlines += graces.values.map(\.deadline)
        deadlines += presences.values.map(\.keepaliveDeadline)
        return deadlines.min()
    }

    /// What the last reload did (`boxkeyd status`).
    public internal(set) var lastReload: String?

    private func wakeTimers() {
        if !ticking { doorbell.signal() }
    }

    public func shutdown() {
        let now = clock.now
        for id in Array(prompts.prompts.keys) { closePrompt(id, .shuttingDown, now: now) }
        for id in Array(waiters.keys) { endWait(id, .shuttingDown) }
        outboxContinuation.finish()
        workContinuation.finish()
        doorbell.signal()
    }

    nonisolated func uid(of user: String) -> UInt32? { userID(user) }

    /// Whether a phone may be enrolled for `user`: not for root unless `[enrolment] root` says so.
    func mayEnrol(_ user: String) -> Bool { config.enrolRoot || uid(of: user) != 0 }
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

/// Which prompts are local enough for phone login (a phone near the box cannot vouch for
/// someone elsewhere). Decided from what logind says of the asking process, never from what
/// it says of itself, except for the terminal of a process logind has no session for (a
/// display manager's worker or getty's `login`, both root, before their session exists).
enum Locality {
    static func refusal(_ r: PAMRequest.WaitRequest, owner: LoginSession?) -> String? {
        if let owner {
            guard owner.isLocal else { return "the asking process is in \(owner.remote ? "a remote session" : "a session on no seat")" }
            if !r.remoteHost.isEmpty, !PAMWire.loopbackHosts.contains(r.remoteHost) { return "remote login from \(logSafe(r.remoteHost))" }
            if owner.sessionClass != "greeter", !r.expectedUser.isEmpty, owner.user != r.expectedUser {
                return "a prompt for \(logSafe(r.expectedUser)) inside \(logSafe(owner.user))'s session"
            }
            return nil
        }
        if !r.remoteHost.isEmpty { return "remote login from \(logSafe(r.remoteHost)) with no local session" }
        if isLocalTerminal(r.tty) || isLocalDisplay(r.display) || isLocalDisplay(r.tty) { return nil }
        return "not a local session (no logind session; terminal \"\(logSafe(r.tty))\")"
    }

    /// A virtual console: tty1 ... tty63 (with or without /dev/).
    static func isLocalTerminal(_ tty: String) -> Bool {
        let name = tty.hasPrefix("/dev/") ? String(tty.dropFirst(5)) : tty
        guard name.hasPrefix("tty"), let n = Int(name.dropFirst(3)) else { return false }
        return (1...63).contains(n)
    }

    /// A local X display: ":0", ":1.0" (a host part means a network display).
    static func isLocalDisplay(_ display: String) -> Bool {
        guard display.hasPrefix(":") else { return false }
        return display.dropFirst().allSatisfy { $0.isNumber || $0 == "." } && display.count > 1
    }
}

extension FrameChannel {
    /// Whether a link other than `id` (live or hung up on, until its disconnection arrives)
    /// uses this channel.
    fileprivate func isHeld(byAnotherLinkThan id: CentralID, in links: [CentralID: Box.PhoneLink]) -> Bool {
        links.contains { $0.key != id && $0.value.reassembler.channel == self }
    }
}
