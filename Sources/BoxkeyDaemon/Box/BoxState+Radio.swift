import BoxkeyCore
import BoxkeyRadio

/// The radio's events and the pairing they finish: links, fragments, handshakes, the slots
/// each phone and user may hold, what a closed channel costs its address.
extension BoxState {
    mutating func handle(_ event: PeripheralEvent, now: Duration) {
        switch event {
        case .connected(let id, let mtu):
            // A central has one connection to a peripheral: a new one from the same address
            // means the old one is gone, whenever its disconnection event arrives.
            for stale in links.keys where stale.address == id.address && stale != id {
                rememberHungUp(stale, channel: links[stale]!.channelTaken, now: now)
                linkEnded(stale, reason: .remoteUser, now: now)
                emit(.radio(.disconnect(stale)))
            }
            // An address over its failure budget may still be an enrolled phone whose address
            // someone else borrowed: it is let in, and only an unknown key from it is refused.
            let limited = failedHandshakes.isLimited(id.address, now: now)
            // Links the box has hung up on, or whose channel is closed, wait only for their
            // disconnection event: they hold no slot. A refused link still waiting to hear why
            // holds one, and is the first to go when the box is full.
            let live = links.values.filter { $0.hangUpWhenHeard || (!$0.dropped && $0.connection.state != .closed) }
            if live.count >= config.maxConnections {
                if let refused = live.filter(\.hangUpWhenHeard).min(by: { $0.connectedAt < $1.connectedAt }) {
                    hangUpNow(refused.id)
                } else {
                    // Unauthenticated links are free to make: a full box drops the oldest of them
                    // rather than refusing everyone after it, so a few random addresses cycling
                    // connections cannot keep an enrolled phone out.
                    guard let victim = live.filter({ $0.connection.state == .awaitingHandshake })
                            .min(by: { $0.connectedAt < $1.connectedAt }) else {
                        audit(.warning, .connectionRefused, "refused \(id.address) at connect: \(live.count) authenticated connections already")
                        rememberHungUp(id, channel: nil, now: now)
                        emit(.radio(.disconnect(id)))
                        return
                    }
                    // Not counted against the victim's address: it may be an honest phone's.
                    audit(.notice, .connectionRefused, "dropped \(victim.id.address) (no handshake yet) to make room for \(id.address)")
                    links[victim.id] = nil
                    rememberHungUp(victim.id, channel: victim.channelTaken, now: now)
                    emit(.radio(.disconnect(victim.id)))
                }
            }
            links[id] = PhoneLink(id: id, mtu: mtu, connectedAt: now, limited: limited, connection: BoxConnection(
                identity: identity.keyPair, boxID: identity.boxID, connectedAt: now,
                handshakeTimeout: config.handshakeTimeout, commandTimeout: config.commandTimeout))
            // BlueZ tells the MTU with the first write, not at connect: it is logged then.
            log(.debug, "connected \(id)")
            wakeTimers()
        case .subscribed(let id, let characteristic):
            guard characteristic == BoxkeyProtocol.responseCharacteristicUUID, links[id] != nil else { return }
            links[id]!.subscribed = true
            let held = links[id]!.unsent
            links[id]!.unsent = []
            if links[id]!.hangUpWhenHeard {
                transmit(held, to: id)
                hangUpNow(id)
            } else {
                send(held, to: id)
            }
        case .unsubscribed(let id, let characteristic):
            if characteristic == BoxkeyProtocol.responseCharacteristicUUID { links[id]?.subscribed = false }
        case .wrote(let id, let characteristic, let value, let mtu):
            guard characteristic == BoxkeyProtocol.requestCharacteristicUUID else { return }
            guard let link = links[id], !link.dropped else {
                // Hung up on, not yet gone: the channel its phone writes on is no other link's.
                if let link = links[id] {
                    if link.channelTaken == nil { links[id]!.channelHeardAfterHangUp = FrameChannel.named(by: value) }
                } else if let forgotten = hungUp[id], forgotten.channel == nil {
                    hungUp[id]!.channel = FrameChannel.named(by: value)
                }
                return
            }
            if !link.mtuLogged || link.mtu != mtu { log(.debug, "\(id): ATT MTU \(mtu)") }
            links[id]!.mtu = mtu
            links[id]!.mtuLogged = true
            receive(fragment: value, from: id, mtu: mtu, now: now)
        case .disconnected(let id, let reason):
            hungUp[id] = nil
            linkEnded(id, reason: reason, now: now)
        }
    }

    mutating func receive(fragment: [UInt8], from id: CentralID, mtu: Int, now: Duration) {
        let message: [UInt8]?
        let wasIdle = links[id]!.reassembler.isIdle
        let hadChannel = links[id]!.reassembler.channel != nil
        do {
            message = try links[id]!.reassembler.receive(fragment, mtu: mtu, now: now)
        } catch {
            audit(.notice, .connectionRefused, "dropped \(id.address): bad fragment: \(error)")
            failedHandshakes.record(id.address, now: now)
            let handshaking = links[id]!.connection.state == .awaitingHandshake
            if handshaking { send([Envelope.refusal(Refusal(.malformed)).encode()], to: id) }
            drop(id)
            return
        }
        if !hadChannel, let channel = links[id]!.reassembler.channel, channel.isHeld(byAnotherLinkThan: id, in: self) {
            // Anything sent on this channel would reach the other phone too: hang up without a word.
            audit(.notice, .connectionRefused, "dropped \(id.address): channel \(channel) is another connection's")
            failedHandshakes.record(id.address, now: now)
            links[id]!.copiedAChannel = true
            drop(id)
            return
        }
        // A message started: the timer loop must learn its reassembly deadline.
        if wasIdle, !links[id]!.reassembler.isIdle { wakeTimers() }
        guard let message else { return }
        var connection = links[id]!.connection
        // Taken out while the connection uses it, so writing to it copies nothing (admit never reads it).
        var replayCache = HandshakeReplayCache()
        swap(&replayCache, &self.replayCache)
        let code = enrolment.current(now: now)
        let limited = links[id]!.limited
        let nonces = nonces
        let output = connection.receive(message, nonces: nonces, replayCache: &replayCache, now: now,
                                        pairingCode: code?.code) { phone, kind in
            admit(phone, kind, fromLimitedAddress: limited, now: now)
        }
        if let refused = output.refusedHandshake, let phone = connection.phoneKey, !registry.isRevoked(phone),
           !enrolledUsers(of: phone).isEmpty || enrolment.pendingEnrolment(of: phone, now: now) != nil {
            _ = replayCache.insert(refused.ephemeral, nonce: refused.nonce, phone: phone)
        }
        self.replayCache = replayCache
        links[id]!.connection = connection
        if case .pairingAttempt? = output.request { links[id]!.pairingCode = code }
        if output.repeatedAnswer {
            log(.info, "\(id.address) sent message 1 again (no answer reached it, or not yet): answered again")
        }
        perform(output, for: id, now: now)
    }

    /// The policy check once a phone's key is known (right after message 1): unknown keys may
    /// only pair; revoked keys nothing; a phone over its rejection budget waits.
    static let slotsPerPhone = 2
    /// Slots the phones of one user hold together (two phones' presence links and a login),
    /// and that phones enrolled for nobody yet (pending, pairing) hold together.
    static let slotsPerUser = 3
    static let slotsForNewPhones = 2

    mutating func admit(_ phone: PublicKey, _ kind: BoxConnection.HandshakeKind, fromLimitedAddress limited: Bool, now: Duration) -> Refusal.Code? {
        if registry.isRevoked(phone) { return .phoneRevoked }
        // One key holds at most two slots (a presence link and a login, or a link whose end
        // the radio has not reported yet): a phone that keeps opening links cannot fill the box.
        let held = links.values.filter { !$0.dropped && $0.connection.state != .closed && $0.connection.phoneKey == phone }.count
        if held >= Self.slotsPerPhone {
            audit(.notice, .connectionRefused, "refused phone \(phone.fingerprint): it already holds \(held) connections", phone: phone.fingerprint)
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
            audit(.notice, .connectionRefused, "refused phone \(phone.fingerprint): phones enrolled for nobody already hold \(Self.slotsForNewPhones) connections", phone: phone.fingerprint)
            return .busy
        }
        if let user = users.sorted().first(where: { user in others.filter { $0.contains(user) }.count >= Self.slotsPerUser }) {
            audit(.notice, .connectionRefused, "refused phone \(phone.fingerprint): \(logSafe(user))'s phones already hold \(Self.slotsPerUser) connections", phone: phone.fingerprint)
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

    mutating func perform(_ output: BoxConnection.Output, for id: CentralID, now: Duration) {
        send(output.replies, to: id)
        switch output.request {
        case nil:
            break
        case .keepalive?:
            presences[id]?.keepalive(now: now)
        case .pairingAttempt(let phone)?:
            enrolment.attempted(now: now)
            audit(.info, .pairing, "pairing attempt: phone \(phone.fingerprint) from \(id.address) (\(enrolment.live?.triesLeft ?? 0) tries left on the code)", phone: phone.fingerprint)
        case .login(let push)?:
            startLogin(push, from: id, now: now)
        case .offer(let offer)?:
            startOffer(offer, from: id, now: now)
        case .withdraw?:
            withdrawPush(on: id, now: now)
        case .action(.pair)?:
            completePairing(on: id, now: now)
        case .action(let action)?:
            // The phone waits for the answer without keepalives; the link still counts.
            presences[id]?.actionStarted()
            emit(.work(.act(action, link: id)))
        case .close(let reason)?:
            closed(id, reason: reason, now: now)
            drop(id)
        }
        wakeTimers()
    }

    mutating func closed(_ id: CentralID, reason: BoxConnection.CloseReason, now: Duration) {
        let phone = links[id]?.connection.phoneKey
        let who = "\(id.address)\(phone.map { " phone \($0.fingerprint)" } ?? "")"
        switch reason {
        case .refused(let code):
            if code == .handshakeFailed || code == .replayedHandshake || code == .malformed || code == .staleAdvertisement
                || code == .notEnrolled || code == .noPairingCode {
                failedHandshakes.record(id.address, now: now)
            }
            // One line per phone (or address) and refusal every 10 minutes: a revoked phone
            // that keeps knocking, or a flood, does not fill the journal.
            let key = "\(phone?.fingerprint ?? id.address.description) \(code.rawValue)"
            refusalsLogged = refusalsLogged.filter { now - $0.value < Self.refusalLogInterval }
            if refusalsLogged[key] == nil {
                refusalsLogged[key] = now
                audit(.notice, .connectionRefused, "refused \(who): \(code) (said once per \(spokenDuration(Self.refusalLogInterval)) for this \(phone == nil ? "address" : "phone"))", phone: phone?.fingerprint)
            } else {
                log(.debug, "refused \(who): \(code)")
            }
        case .protocolViolation(let why):
            if links[id]?.pairingCode != nil, why != BoxConnection.tooManyRepeats { audit(.notice, .pairingFailed, "pairing failed \(who): wrong code (\(why))", phone: phone?.fingerprint) } else {
                audit(.notice, .connectionRefused, "dropped \(who): \(why)", phone: phone?.fingerprint)
            }
        case .timedOut:
            failedHandshakes.record(id.address, now: now)
            log(.info, "timed out \(who)")
        case .peerError(let e):
            log(.info, "phone \(id.address) ended the channel: \(e.code) \(logSafe(e.detail))")
        case .finished:
            break
        case .detached:
            if let p = presences.removeValue(forKey: id) {
                audit(.info, .presence, "presence link closed by the phone: phone \(p.phone.fingerprint) user \(logSafe(p.user)) (no walk-away action)", phone: p.phone.fingerprint, user: p.user)
                readvertise()
            }
        }
    }

    mutating func send(_ envelopes: [[UInt8]], to id: CentralID) {
        guard let link = links[id], !link.dropped, !envelopes.isEmpty, link.reassembler.channel != nil else { return }
        guard link.subscribed else {
            guard link.unsent.count + envelopes.count <= 4 else {
                log(.notice, "\(id.address) did not subscribe to responses; dropping it")
                drop(id)
                return
            }
            links[id]!.unsent += envelopes
            return
        }
        transmit(envelopes, to: id)
    }

    private mutating func transmit(_ envelopes: [[UInt8]], to id: CentralID) {
        // Whatever is said on a channel reaches every phone on it: never to a link that copied
        // one another link held first. (The first holder keeps it while the copy's
        // disconnection is on its way: refusing it too would cost an honest phone its answer.)
        guard let link = links[id], let channel = link.reassembler.channel, !link.copiedAChannel else { return }
        for envelope in envelopes {
            guard let fragments = try? Framing.fragment(envelope, mtu: link.mtu, channel: channel) else { continue }
            emit(.radio(.notify(id, fragments: fragments)))
        }
    }

    /// Hangs up. A phone's first message can arrive before its subscription: what the box
    /// said to it then (a refusal) waits for the subscription, and so does the hang-up.
    mutating func drop(_ id: CentralID) {
        guard let link = links[id] else { return emit(.radio(.disconnect(id))) }
        guard !link.dropped else { return }
        links[id]!.dropped = true
        if !link.subscribed, !link.unsent.isEmpty {
            links[id]!.hangUpWhenHeard = true
            wakeTimers()
            return
        }
        emit(.radio(.disconnect(id)))
    }

    /// Hangs up a link that was waiting to hear why it was refused (`drop`).
    mutating func hangUpNow(_ id: CentralID) {
        links[id]?.hangUpWhenHeard = false
        emit(.radio(.disconnect(id)))
    }

    /// When a refused link that never subscribes is hung up anyway.
    func hangUpDeadline(of link: PhoneLink) -> Duration { link.connectedAt + config.handshakeTimeout }

    mutating func linkEnded(_ id: CentralID, reason: DisconnectReason, now: Duration) {
        guard let link = links.removeValue(forKey: id) else { return }
        log(.debug, "disconnected \(id): \(reason)")
        if let presence = presences.removeValue(forKey: id) {
            audit(.info, .presence, "presence link lost: phone \(presence.phone.fingerprint) user \(logSafe(presence.user)) (\(reason))", phone: presence.phone.fingerprint, user: presence.user)
            startGrace(phone: presence.phone, user: presence.user, reason: "link lost (\(reason))", now: now)
            readvertise()
        }
        if link.connection.state == .awaitingPairConfirm {
            audit(.notice, .pairingFailed, "pairing failed: \(id.address) phone \(link.connection.phoneKey?.fingerprint ?? "?") left without proving the code", phone: link.connection.phoneKey?.fingerprint)
        }
        // A PAM stack verifying this link's push still gets its answer; the phone will not.
        if let promptID = link.prompt, prompts[promptID]?.delivered == true {
            log(.info, "\(id.address) left while its push was being verified")
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
            log(.info, "\(id.address) left while its proximity offer was on the screen")
            // Enter was pressed for it: nothing else may answer that Enter.
            if prompts[promptID]!.entered { endWait(promptID, .timedOut) }
        }
    }

    // MARK: - Pairing

    mutating func completePairing(on id: CentralID, now: Duration) {
        guard let link = links[id], let phone = link.connection.phoneKey, let code = link.pairingCode else { return }
        var outcome = ActionResult.Outcome.done
        // One phone per code: a second phone that handshook under it before the first
        // confirmed finds it used up.
        guard enrolment.confirmable(code.code, now: now) else {
            audit(.notice, .pairingFailed, "pairing refused: phone \(phone.fingerprint): the code was used up or expired before it confirmed", phone: phone.fingerprint)
            guard var connection = links[id]?.connection else { return }
            let output = connection.finishAction(ActionResult(action: .pair, outcome: .failed))
            links[id]?.connection = connection
            return perform(output, for: id, now: now)
        }
        if let user = enrolment.paired(phone, code: code, now: now) {
            do {
                try registry.enrol(phone, user: user, name: "", by: "pairing code (admin)")
                audit(.notice, .enrolled, "enrolled: phone \(phone.fingerprint) for user \(logSafe(user)) by an admin's pairing code", phone: phone.fingerprint, user: user)
                publishToFleet(phone, user: user, name: "")
            } catch {
                log(.error, "cannot enrol phone \(phone.fingerprint): \(error)")
                outcome = .failed
            }
        } else {
            let scope = code.user.map { " for user \(logSafe($0))" } ?? ""
            audit(.notice, .pairing, "paired: phone \(phone.fingerprint)\(scope); its first accepted login within \(config.pendingEnrolment) enrols it", phone: phone.fingerprint, user: code.user)
        }
        guard var connection = links[id]?.connection else { return }
        let output = connection.finishAction(ActionResult(action: .pair, outcome: outcome))
        links[id]?.connection = connection
        perform(output, for: id, now: now)
    }

}

extension BoxState {
    /// How long a link the box hung up on and forgot keeps its channel from others if its
    /// disconnection never arrives (beyond any supervision timeout, 32 s at most).
    static let hungUpChannelMemory: Duration = .seconds(60)
    static let hungUpLinksKept = 1024

    /// A link hung up on and forgotten: its channel (nil: none yet) stays taken until its
    /// disconnection arrives.
    mutating func rememberHungUp(_ id: CentralID, channel: FrameChannel?, now: Duration) {
        hungUp[id] = HungUpLink(channel: channel, since: now)
        hungUp = hungUp.filter { now - $0.value.since < Self.hungUpChannelMemory }
        // A flood of connections within that minute (entries come only with connections, so
        // this is far more than a disconnection's few hundred ms allow): those that name no
        // channel go first, then the oldest.
        let rank = { (link: HungUpLink) in (link.channel == nil ? 0 : 1, link.since) }
        while hungUp.count > Self.hungUpLinksKept, let gone = hungUp.min(by: { rank($0.value) < rank($1.value) }) {
            hungUp[gone.key] = nil
        }
    }
}

extension FrameChannel {
    /// Whether a link other than `id` uses this channel: live, or hung up on, until its
    /// disconnection arrives.
    fileprivate func isHeld(byAnotherLinkThan id: CentralID, in state: BoxState) -> Bool {
        state.links.contains { $0.key != id && $0.value.channelTaken == self }
            || state.hungUp.contains { $0.key != id && $0.value.channel == self }
    }
}
