import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio
import Foundation
import Logging

/// What the box must send or do on the radio. One task performs these in order, so the
/// fragments of two messages to one phone never interleave.
enum RadioAction: Sendable {
    case notify(CentralID, fragments: [[UInt8]])
    case disconnect(CentralID)
    case advertise(AdvertisingData)
}

/// The box: every phone link, every PAM prompt waiting for a push, presence and grace timers.
/// All state lives in this actor; the radio loop, the PAM bridge and the ticker call into it.
public actor Box {
    let config: DaemonConfig
    public nonisolated let identity: BoxIdentity
    var registry: PhoneRegistry
    let sessions: any SessionControl
    let clock: any RadioClock
    let logger: Logger
    let audit: Logger
    /// What the status command reports as the radio in use.
    public nonisolated let radioDescription: String

    // Radio
    var nonces = AdvertisementNonces.random()
    var replayCache = HandshakeReplayCache()
    var links: [CentralID: PhoneLink] = [:]
    let outbox: AsyncStream<RadioAction>
    let outboxContinuation: AsyncStream<RadioAction>.Continuation

    // PAM
    var prompts: [UInt64: Prompt] = [:]
    var nextPromptID: UInt64 = 0
    var sessionsByUser: [String: String] = [:]
    /// Users whose session the box locked: a phone must push again (unlock), not just attach.
    var lockedUsers: Set<String> = []

    // Presence
    var presences: [CentralID: Presence] = [:]
    var graces: [PublicKey: Grace] = [:]

    // Limits
    /// Failed or stalled handshakes per radio address: a flooding address is cut off at
    /// connect, while phones that authenticate are never counted (a flood must not lock out
    /// honest phones).
    var failedHandshakes: RateLimiter<DeviceAddress>
    var rejectedByPhone: RateLimiter<PublicKey>
    var rejectedTotal: RateLimiter<String>

    /// Wakes the timer loop when a new deadline appears.
    let doorbell = ChangeSignal()
    /// While the timer loop runs `tick`, new deadlines need no ring: the loop asks for the next
    /// deadline right after. (Ringing from inside a tick made the loop spin while a phone was
    /// connected.)
    var ticking = false
    /// How often the timer loop has run: tests check an idle link costs (almost) nothing.
    public private(set) var ticks = 0

    struct PhoneLink {
        var id: CentralID
        var mtu: Int
        var reassembler = FrameReassembler()
        var connection: BoxConnection
        var subscribed = false
        var deviceName = ""
        var prompt: UInt64?
    }

    struct Prompt {
        var request: PAMRequest.WaitRequest
        var deadline: Duration
        var waiter: CheckedContinuation<PAMReply, Never>?
        /// Set once a push went to this prompt: whose it was, for the outcome relay.
        var verifying: (link: CentralID, phone: PublicKey, user: String, name: String)?
    }

    struct Presence {
        var phone: PublicKey
        var user: String
        var samples: [Int] = []
        var belowSince: Duration?
        var nextSample: Duration
    }

    struct Grace {
        var user: String
        var deadline: Duration
        var reason: String
    }

    public init(config: DaemonConfig, identity: BoxIdentity, registry: PhoneRegistry, sessions: any SessionControl,
                clock: any RadioClock, logger: Logger, radioDescription: String) {
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
        failedHandshakes = RateLimiter(limit: config.failedHandshakesPerMinute, window: .seconds(60))
        rejectedByPhone = RateLimiter(limit: config.rejectedPushesPerPhone, window: config.rejectionWindow)
        rejectedTotal = RateLimiter(limit: config.rejectedPushesTotal, window: config.rejectionWindow)
        (outbox, outboxContinuation) = AsyncStream.makeStream(of: RadioAction.self)
    }

    // MARK: - Advertisement and GATT

    public var gattService: GATTService {
        GATTService(uuid: BoxkeyProtocol.serviceUUID, characteristics: [
            GATTCharacteristic(uuid: BoxkeyProtocol.infoCharacteristicUUID, properties: .read,
                               value: BoxInfo(boxID: identity.boxID, staticKey: identity.keyPair.publicKey).encode()),
            GATTCharacteristic(uuid: BoxkeyProtocol.requestCharacteristicUUID, properties: [.write, .writeWithoutResponse]),
            GATTCharacteristic(uuid: BoxkeyProtocol.responseCharacteristicUUID, properties: .notify),
        ])
    }

    public var advertisingData: AdvertisingData {
        var flags: Advertisement.Flags = []
        if prompts.values.contains(where: { $0.waiter != nil }) { flags.insert(.loginPromptWaiting) }
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
            if failedHandshakes.isLimited(id.address, now: now) {
                logger.notice("refusing \(id.address): too many failed handshakes in the last minute")
                outboxContinuation.yield(.disconnect(id))
                return
            }
            guard links.count < config.maxConnections else {
                logger.warning("refusing \(id.address): \(links.count) connections already")
                outboxContinuation.yield(.disconnect(id))
                return
            }
            links[id] = PhoneLink(id: id, mtu: mtu, connection: BoxConnection(
                identity: identity.keyPair, boxID: identity.boxID, connectedAt: now,
                handshakeTimeout: config.handshakeTimeout, commandTimeout: config.commandTimeout))
            logger.debug("connected \(id), MTU \(mtu)")
            wakeTimers()
        case .subscribed(let id, let characteristic):
            if characteristic == BoxkeyProtocol.responseCharacteristicUUID { links[id]?.subscribed = true }
        case .unsubscribed(let id, let characteristic):
            if characteristic == BoxkeyProtocol.responseCharacteristicUUID { links[id]?.subscribed = false }
        case .wrote(let id, let characteristic, let value, let mtu):
            guard characteristic == BoxkeyProtocol.requestCharacteristicUUID, links[id] != nil else { return }
            links[id]!.mtu = mtu
            receive(fragment: value, from: id, mtu: mtu, now: now)
        case .disconnected(let id, let reason):
            linkEnded(id, reason: reason, now: now)
        }
    }

    private func receive(fragment: [UInt8], from id: CentralID, mtu: Int, now: Duration) {
        let message: [UInt8]?
        do {
            message = try links[id]!.reassembler.receive(fragment, mtu: mtu, now: now)
        } catch {
            logger.notice("bad fragment from \(id.address): \(error)")
            failedHandshakes.record(id.address, now: now)
            let handshaking = links[id]!.connection.state == .awaitingHandshake
            if handshaking { send([Envelope.refusal(Refusal(.malformed)).encode()], to: id) }
            drop(id)
            return
        }
        guard let message else { return }
        var connection = links[id]!.connection
        let output = connection.receive(message, nonces: nonces, replayCache: &replayCache, now: now) { [self] phone in
            admit(phone, now: now)
        }
        links[id]!.connection = connection
        perform(output, for: id, now: now)
    }

    /// The policy check once a phone's key is known: revoked, or too many rejections.
    private func admit(_ phone: PublicKey, now: Duration) -> Refusal.Code? {
        if registry.isRevoked(phone) { return .phoneRevoked }
        if rejectedByPhone.isLimited(phone, now: now) || rejectedTotal.isLimited("all", now: now) { return .rateLimited }
        return nil
    }

    private func perform(_ output: BoxConnection.Output, for id: CentralID, now: Duration) {
        send(output.replies, to: id)
        switch output.request {
        case nil:
            break
        case .login(let push)?:
            startLogin(push, from: id, now: now)
        case .action(let action)?:
            Task { await self.act(action, for: id) }
        case .close(let reason)?:
            let phone = links[id]?.connection.phoneKey
            switch reason {
            case .refused(let code):
                if code == .handshakeFailed || code == .replayedHandshake || code == .malformed || code == .staleAdvertisement {
                    failedHandshakes.record(id.address, now: now)
                }
                audit.info("refused \(id.address)\(phone.map { " phone \($0.fingerprint)" } ?? ""): \(code)")
            case .protocolViolation(let why):
                audit.notice("dropped \(id.address)\(phone.map { " phone \($0.fingerprint)" } ?? ""): \(why)")
            case .timedOut:
                failedHandshakes.record(id.address, now: now)
                logger.info("timed out \(id.address)")
            case .peerError(let e):
                logger.info("phone \(id.address) ended the channel: \(e.code) \(e.detail)")
            case .finished:
                break
            case .detached:
                if let p = presences.removeValue(forKey: id) {
                    audit.info("presence link closed by the phone: phone \(p.phone.fingerprint) user \(p.user) (no walk-away action)")
                    readvertise()
                }
            }
            drop(id)
        }
        wakeTimers()
    }

    private func send(_ envelopes: [[UInt8]], to id: CentralID) {
        guard let link = links[id], !envelopes.isEmpty else { return }
        guard link.subscribed else {
            logger.notice("\(id.address) did not subscribe to responses; dropping it")
            drop(id)
            return
        }
        for envelope in envelopes {
            guard let fragments = try? Framing.fragment(envelope, mtu: link.mtu) else { continue }
            outboxContinuation.yield(.notify(id, fragments: fragments))
        }
    }

    private func drop(_ id: CentralID) {
        outboxContinuation.yield(.disconnect(id))
    }

    private func linkEnded(_ id: CentralID, reason: DisconnectReason, now: Duration) {
        guard let link = links.removeValue(forKey: id) else { return }
        logger.debug("disconnected \(id): \(reason)")
        if let presence = presences.removeValue(forKey: id) {
            audit.info("presence link lost: phone \(presence.phone.fingerprint) user \(presence.user) (\(reason))")
            startGrace(phone: presence.phone, user: presence.user, reason: "link lost (\(reason))", now: now)
            readvertise()
        }
        // A PAM stack verifying this link's push still gets its answer; the phone will not.
        if let promptID = link.prompt, prompts[promptID]?.verifying != nil {
            logger.info("\(id.address) left while its push was being verified")
        }
    }

    // MARK: - Login

    private func startLogin(_ push: CredentialPush, from id: CentralID, now: Duration) {
        guard let phone = links[id]?.connection.phoneKey else { return }
        links[id]?.deviceName = push.deviceName
        let waiting = prompts.filter { $0.value.waiter != nil }.sorted { $0.key > $1.key }
        guard !waiting.isEmpty else {
            audit.info("push from phone \(phone.fingerprint) user \(push.user): box is not at a login prompt")
            finishLogin(on: id, LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt"), now: now)
            return
        }
        guard let (promptID, prompt) = waiting.first(where: { $0.value.request.expectedUser.isEmpty || $0.value.request.expectedUser == push.user }) else {
            audit.info("push from phone \(phone.fingerprint) user \(push.user): the prompt is for another user")
            finishLogin(on: id, LoginResult(.wrongUser, reason: "the box is locked by another user"), now: now)
            return
        }
        prompts[promptID]!.waiter = nil
        prompts[promptID]!.verifying = (id, phone, push.user, push.deviceName)
        prompts[promptID]!.deadline = now + config.outcomeTimeout
        links[id]?.prompt = promptID
        audit.info("login attempt: phone \(phone.fingerprint) (\(push.deviceName)) user \(push.user) into \(prompt.request.service)")
        prompt.waiter?.resume(returning: .push(user: push.user, password: push.password.unprotectedCopy))
        readvertise()
        wakeTimers()
    }

    private func finishLogin(on id: CentralID, _ result: LoginResult, now: Duration) {
        guard var connection = links[id]?.connection else { return }
        let output = connection.finishLogin(result)
        links[id]?.connection = connection
        perform(output, for: id, now: now)
    }

    // MARK: - PAM bridge

    public func status() -> PAMReply {
        .info(boxID: identity.boxID.description, fingerprint: identity.fingerprint)
    }

    /// Registers a login prompt; the push (or the timeout) comes through `awaitPush`.
    public func registerPrompt(_ request: PAMRequest.WaitRequest) -> UInt64 {
        nextPromptID += 1
        let id = nextPromptID
        let wait = min(Duration.milliseconds(Int(request.timeoutMilliseconds)), config.maxPromptWait)
        // A new prompt on the same terminal replaces the old one (the greeter restarted).
        for (other, p) in prompts where p.waiter != nil && p.request.service == request.service && p.request.tty == request.tty {
            resolve(other, .noPush(.superseded))
        }
        prompts[id] = Prompt(request: request, deadline: clock.now + wait, waiter: nil)
        logger.info("login prompt waiting: \(request.service)\(request.tty.isEmpty ? "" : " on \(request.tty)")\(request.expectedUser.isEmpty ? "" : " for \(request.expectedUser)")")
        wakeTimers()
        return id
    }

    /// Waits for a push to prompt `id`, its timeout, or its cancellation.
    public func awaitPush(_ id: UInt64) async -> PAMReply {
        // Shutting down (or the connection's task ending) releases the prompt at once.
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<PAMReply, Never>) in
                guard prompts[id] != nil, prompts[id]?.verifying == nil, !Task.isCancelled else {
                    c.resume(returning: .noPush(.shuttingDown))
                    return
                }
                prompts[id]?.waiter = c
                readvertise()
            }
        } onCancel: {
            Task { await self.resolve(id, .noPush(.shuttingDown)) }
        }
    }

    public func hasPush(_ id: UInt64) -> Bool { prompts[id]?.verifying != nil }

    private func resolve(_ id: UInt64, _ reply: PAMReply) {
        guard let waiter = prompts[id]?.waiter else { return }
        prompts[id]?.waiter = nil
        if prompts[id]?.verifying == nil { prompts[id] = nil }
        waiter.resume(returning: reply)
        readvertise()
    }

    /// The module gave up, or its connection closed.
    public func promptClosed(_ id: UInt64) {
        guard let prompt = prompts[id] else { return }
        if prompt.waiter != nil { resolve(id, .noPush(.timedOut)); return }
        if prompt.verifying != nil {
            // The stack ended without a report (the application died): tell the phone no.
            report(id, accepted: false, reason: "the login was abandoned")
        }
        prompts[id] = nil
    }

    /// The PAM stack's verdict on a push.
    public func report(_ id: UInt64, accepted: Bool, reason: String) {
        guard let prompt = prompts.removeValue(forKey: id), let v = prompt.verifying else { return }
        let now = clock.now
        if accepted {
            audit.info("login accepted: phone \(v.phone.fingerprint) (\(v.name)) user \(v.user) via \(prompt.request.service)")
            do {
                if try registry.recordLogin(v.phone, user: v.user, name: v.name) {
                    audit.info("paired: new phone \(v.phone.fingerprint) (\(v.name)) for user \(v.user)")
                }
            } catch {
                logger.error("cannot record phone \(v.phone.fingerprint): \(error)")
            }
            lockedUsers.remove(v.user)
            if links[v.link] != nil {
                presences[v.link] = Presence(phone: v.phone, user: v.user, nextSample: now + config.rssiInterval)
                graces[v.phone] = nil
            }
            finishLogin(on: v.link, LoginResult(.accepted), now: now)
            readvertise()
        } else {
            rejectedByPhone.record(v.phone, now: now)
            rejectedTotal.record("all", now: now)
            audit.info("login rejected: phone \(v.phone.fingerprint) user \(v.user) via \(prompt.request.service): \(reason)")
            finishLogin(on: v.link, LoginResult(.rejected, reason: reason.isEmpty ? "the password was not accepted" : reason), now: now)
        }
    }

    public func openSession(user: String, sessionID: String, service: String) {
        guard !sessionID.isEmpty else { return }
        sessionsByUser[user] = sessionID
        logger.info("session \(sessionID) opened for \(user) by \(service)")
    }

    public func closeSession(sessionID: String) {
        sessionsByUser = sessionsByUser.filter { $0.value != sessionID }
    }

    // MARK: - Lock, logout, attach, walk-away

    private func act(_ action: ActionResult.Action, for id: CentralID) async {
        guard let phone = links[id]?.connection.phoneKey else { return }
        let user = registry.phone(phone)?.user
        var outcome: ActionResult.Outcome = .noSession
        if let user, let session = sessionsByUser[user], action != .attach || !lockedUsers.contains(user) {
            switch action {
            case .lock:
                outcome = await run("lock", session: session, user: user, phone: phone, reason: "phone asked") { try await self.sessions.lock(session: $0) }
                if outcome == .done { lockedUsers.insert(user) }
                endPresence(of: phone)
            case .logout:
                outcome = await run("logout", session: session, user: user, phone: phone, reason: "phone asked") { try await self.sessions.terminate(session: $0) }
                if outcome == .done { sessionsByUser[user] = nil }
                endPresence(of: phone)
            case .attach:
                graces[phone] = nil
                presences[id] = Presence(phone: phone, user: user, nextSample: clock.now + config.rssiInterval)
                audit.info("presence link back: phone \(phone.fingerprint) user \(user)")
                outcome = .done
            }
        }
        guard var connection = links[id]?.connection else { return }
        let output = connection.finishAction(ActionResult(action: action, outcome: outcome))
        links[id]?.connection = connection
        perform(output, for: id, now: clock.now)
        readvertise()
    }

    /// After an explicit lock or logout the phone's presence links have nothing left to guard.
    private func endPresence(of phone: PublicKey) {
        for (id, p) in presences where p.phone == phone {
            presences[id] = nil
            drop(id)
        }
        graces[phone] = nil
    }

    private func run(_ what: String, session: String, user: String, phone: PublicKey, reason: String,
                     _ body: @Sendable (String) async throws -> Void) async -> ActionResult.Outcome {
        do {
            try await body(session)
            audit.info("\(what): session \(session) user \(user) phone \(phone.fingerprint) (\(reason))")
            return .done
        } catch {
            logger.error("\(what) of session \(session) failed: \(error)")
            return .failed
        }
    }

    private func startGrace(phone: PublicKey, user: String, reason: String, now: Duration) {
        guard config.policy != .none else { return }
        graces[phone] = Grace(user: user, deadline: now + config.grace, reason: reason)
        wakeTimers()
    }

    private func walkAway(phone: PublicKey, user: String, reason: String) async {
        guard let session = sessionsByUser[user] else {
            logger.warning("phone \(phone.fingerprint) walked away but user \(user) has no registered session to \(config.policy.rawValue)")
            return
        }
        switch config.policy {
        case .lock:
            if await run("walk-away lock", session: session, user: user, phone: phone, reason: reason, { try await self.sessions.lock(session: $0) }) == .done {
                lockedUsers.insert(user)
            }
        case .logout:
            if await run("walk-away logout", session: session, user: user, phone: phone, reason: reason, { try await self.sessions.terminate(session: $0) }) == .done {
                sessionsByUser[user] = nil
            }
        case .none:
            break
        }
    }

    /// An RSSI sample of a presence link; acts when the mean stays below the lock threshold
    /// for `awayAfter`, and forgets the countdown only above the return threshold (hysteresis).
    public func rssiSample(_ id: CentralID, _ rssi: Int, now: Duration) async {
        guard var p = presences[id] else { return }
        p.samples.append(rssi)
        if p.samples.count > config.rssiSamples { p.samples.removeFirst(p.samples.count - config.rssiSamples) }
        p.nextSample = now + config.rssiInterval
        let mean = Double(p.samples.reduce(0, +)) / Double(p.samples.count)
        if p.samples.count >= config.rssiSamples, mean < Double(config.rssiLockThreshold) {
            p.belowSince = p.belowSince ?? now
        } else if mean > Double(config.rssiReturnThreshold) {
            p.belowSince = nil
        }
        presences[id] = p
        if let since = p.belowSince, now - since >= config.awayAfter {
            presences[id] = nil
            audit.info("walked away: phone \(p.phone.fingerprint) user \(p.user), mean RSSI \(Int(mean)) dBm")
            drop(id)
            readvertise()
            await walkAway(phone: p.phone, user: p.user, reason: "signal below \(config.rssiLockThreshold) dBm")
        }
    }

    // MARK: - Time

    /// Runs every timeout that is due; returns the links whose RSSI should be sampled now.
    public func tick() async -> [CentralID] {
        ticking = true
        ticks += 1
        defer { ticking = false }
        let now = clock.now
        for id in Array(links.keys) {
            guard var link = links[id] else { continue }
            do { try link.reassembler.checkTimeout(now: now) } catch {
                logger.notice("\(id.address) stalled mid-message")
                drop(id)
            }
            let output = link.connection.tick(now: now)
            links[id] = link
            perform(output, for: id, now: now)
        }
        for (id, prompt) in prompts where prompt.deadline <= now {
            if prompt.waiter != nil {
                resolve(id, .noPush(.timedOut))
            } else if let v = prompt.verifying {
                prompts[id] = nil
                finishLogin(on: v.link, LoginResult(.timedOut, reason: "the login prompt did not report an outcome"), now: now)
            }
        }
        for (phone, grace) in graces where grace.deadline <= now {
            graces[phone] = nil
            await walkAway(phone: phone, user: grace.user, reason: grace.reason)
        }
        return presences.filter { $0.value.nextSample <= now }.map(\.key)
    }

    /// The earliest time anything needs attention, or nil when the box is idle.
    public func nextDeadline() -> Duration? {
        var deadlines: [Duration] = []
        for link in links.values {
            if let d = link.connection.nextDeadline { deadlines.append(d) }
            if !link.reassembler.isIdle { deadlines.append(clock.now + .milliseconds(500)) }
        }
        deadlines += prompts.values.map(\.deadline)
        deadlines += graces.values.map(\.deadline)
        deadlines += presences.values.map(\.nextSample)
        return deadlines.min()
    }

    // MARK: - Admin

    public func phoneList() -> String {
        let formatter = ISO8601DateFormatter()
        if registry.phones.isEmpty { return "no phones have logged in to this box yet" }
        return registry.phones.map { p in
            "\(p.fingerprint)  \(p.user)  \(p.name.isEmpty ? "-" : p.name)  first \(formatter.string(from: p.firstLogin))  last \(formatter.string(from: p.lastLogin))\(p.revokedAt.map { "  REVOKED \(formatter.string(from: $0))" } ?? "")"
        }.joined(separator: "\n")
    }

    public func revoke(fingerprint: String) -> PAMReply {
        do {
            let phone = try registry.revoke(fingerprint: fingerprint)
            audit.info("revoked: phone \(phone.fingerprint) (\(phone.name)) user \(phone.user)")
            // Drop its live links: a revoked phone keeps nothing.
            for (id, link) in links where link.connection.phoneKey.map({ hex($0.bytes) }) == phone.key {
                presences[id] = nil
                drop(id)
            }
            return .text("revoked \(phone.fingerprint) (\(phone.user), \(phone.name))")
        } catch {
            return .error("\(error)")
        }
    }

    public func statusText() -> String {
        var lines = [
            "box ID:      \(identity.boxID)",
            "key:         \(identity.fingerprint)",
            "radio:       \(radioDescription)",
            "connections: \(links.count)",
            "prompts:     \(prompts.values.filter { $0.waiter != nil }.map { "\($0.request.service)\($0.request.tty.isEmpty ? "" : "@\($0.request.tty)")" }.joined(separator: ", "))",
            "presence:    \(presences.values.map { "\($0.user) (phone \($0.phone.fingerprint))" }.joined(separator: ", "))",
            "phones:      \(registry.phones.filter { !$0.revoked }.count) paired, \(registry.phones.filter(\.revoked).count) revoked",
        ]
        if !graces.isEmpty { lines.append("grace:       \(graces.values.map(\.user).joined(separator: ", "))") }
        return lines.joined(separator: "\n")
    }

    private func wakeTimers() {
        if !ticking { doorbell.signal() }
    }

    public func shutdown() {
        for id in Array(prompts.keys) { resolve(id, .noPush(.shuttingDown)) }
        outboxContinuation.finish()
        doorbell.signal()
    }
}
