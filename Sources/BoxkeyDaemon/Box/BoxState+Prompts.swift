import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio

/// The prompts the PAM module opens (a new prompt, Enter at one, its end) and the timers:
/// what is due at `now`, and when the next thing is.
extension BoxState {
    /// Whether phone login may be offered at a prompt at all, before logind is asked who asks:
    /// nil, or the refusal. `noRadio` says why there is no radio, when there is none.
    mutating func promptRefusal(_ request: PAMRequest.WaitRequest, pid: Int32, noRadio: String?) -> PAMReply? {
        if let noRadio {
            audit(.info, .notOffered, "not offering phone login to \(asking(request, pid)): \(noRadio)", service: request.service)
            return .notOffered("no radio: \(noRadio)")
        }
        guard config.phoneLoginServices.contains(request.service) else {
            audit(.info, .notOffered, "not offering phone login to \(asking(request, pid)): service not configured for it", service: request.service)
            return .notOffered("phone login is not enabled for \(request.service)")
        }
        return nil
    }

    /// logind said which session the asking process is in (`SessionControl.promptOwner`): the
    /// prompt opens if that is local (`Locality`).
    mutating func admitPrompt(_ request: PAMRequest.WaitRequest, owner: Result<LoginSession?, any Error>, pid: Int32,
                              now: Duration) -> (id: UInt64?, reply: PAMReply) {
        switch owner {
        case .failure(let error):
            audit(.warning, .notOffered, "not offering phone login to \(asking(request, pid)): logind did not answer (\(error))", service: request.service)
            return (nil, .notOffered("logind did not answer"))
        case .success(let owner):
            if let why = Locality.refusal(request, owner: owner) {
                audit(.notice, .notOffered, "not offering phone login to \(asking(request, pid)): \(why)", service: request.service)
                return (nil, .notOffered(why))
            }
            let opened = openPrompt(request, owner: owner, pid: pid, now: now)
            return (opened.id, opened.reply)
        }
    }

    private func asking(_ request: PAMRequest.WaitRequest, _ pid: Int32) -> String {
        "\(logSafe(request.service))\(request.tty.isEmpty ? "" : " on \(logSafe(request.tty))") (pid \(pid))"
    }

    /// A prompt logind called local opens: the prompts it replaces close, the advertisement
    /// says a prompt waits, and the module hears what to show.
    mutating func openPrompt(_ request: PAMRequest.WaitRequest, owner: LoginSession?, pid: Int32, now: Duration) -> (id: UInt64, reply: PAMReply) {
        let (id, superseded) = prompts.add(request, owner: owner, pid: pid)
        for other in superseded { closePrompt(other, .superseded, now: now) }
        let code = enrolment.codeForPrompt(user: request.expectedUser.isEmpty ? nil : request.expectedUser, now: now)
        log(.info, "login prompt waiting: \(logSafe(prompts[id]!.description))\(request.expectedUser.isEmpty ? "" : " for \(logSafe(request.expectedUser))") (pid \(pid))")
        readvertise()
        wakeTimers()
        let seconds = code.map { UInt32(max(0, ($0.expires - now).components.seconds)) } ?? 0
        prompts[id]!.shownCode = code?.code.text ?? ""
        return (id, .prompt(boxID: identity.boxID.description, fingerprint: identity.fingerprint, pairingCode: code?.code.text ?? "", codeSeconds: seconds))
    }

    /// Enter with no push for it: "nothing yet", with a new pairing code when the one the prompt
    /// showed is used up (its tries) or expired, so that Enter renews it.
    mutating func nothingYet(at id: UInt64, now: Duration) -> PromptAnswer {
        guard let prompt = prompts[id], !prompt.shownCode.isEmpty, enrolment.current(now: now)?.code.text != prompt.shownCode,
              let code = enrolment.codeForPrompt(user: prompt.request.expectedUser.isEmpty ? nil : prompt.request.expectedUser, now: now) else {
            return .noPush(.nothingYet)
        }
        prompts[id]!.shownCode = code.code.text
        log(.info, "a new pairing code at \(logSafe(prompt.description)): the one it showed is used up or expired")
        return .nothingYetNewCode(code: code.code.text, seconds: UInt32(max(0, (code.expires - now).components.seconds)))
    }

    /// What Enter at a prompt gets now, or that it waits for the offering phone's push.
    enum Enter {
        case answer(PromptAnswer)
        case waitForPush
    }

    /// Enter at prompt `id` with nothing typed: the push held there, at once; the push of the
    /// phone whose offer waits there (asked now), within `wait`; else `.noPush(.nothingYet)` at
    /// once, and the prompt stays open.
    mutating func enter(_ id: UInt64, wait: Duration, now: Duration) -> Enter {
        guard let prompt = prompts[id] else { return .answer(.noPush(.superseded)) }
        if let held = prompt.held {
            if let v = prompt.verifying, !mayStillDeliver(v, now: now) {
                dropHeld(id, .wrongUser, "phone revoked before Enter was pressed (no longer enrolled for \(logSafe(v.user)) at box \(identity.boxID))", now: now)
                return .answer(nothingYet(at: id, now: now))
            }
            deliver(held, to: id, now: now)
            readvertise()
            return .answer(held)
        }
        guard !waiting.contains(id), prompt.verifying == nil else { return .answer(.noPush(.timedOut)) }
        // Only a phone that offered here is waited for: a connection alone says nothing about
        // whose push would come (anyone in range can open one), so Enter with no push or offer
        // here is answered at once.
        guard prompt.offer != nil, giveIntent(id, now: now) else { return .answer(nothingYet(at: id, now: now)) }
        prompts[id]!.deadline = now + min(wait, config.maxPromptWait, config.commandTimeout)
        log(.info, "Enter at \(logSafe(prompt.description)): the offering phone pushes now")
        prompts[id]!.entered = true
        wakeTimers()
        return .waitForPush
    }

    /// The module has a delivered push: its next requests are about that push.
    func hasPush(_ id: UInt64) -> Bool { prompts[id]?.delivered == true }

    /// Ends an Enter's wait for a phone that did not push; the prompt stays open. Also when
    /// nobody waits any more (the wait's task was cancelled): the Enter is over either way, and
    /// its deadline must not stay due.
    mutating func endWait(_ id: UInt64, _ reason: PAMReply.NoPushReason) {
        let waited = waiting.remove(id) != nil
        if prompts[id]?.entered == true {
            prompts[id]!.entered = false
            if prompts[id]!.verifying == nil { prompts[id]!.deadline = nil }
            if let offer = prompts[id]!.offer, offer.intent, prompts[id]!.verifying == nil { prompts[id]!.offer = nil }
        }
        if waited { emit(.answer(prompt: id, .noPush(reason))) }
    }

    /// A prompt ends before its push was delivered (another took its place, shutdown): what
    /// waited on it hears so.
    mutating func closePrompt(_ id: UInt64, _ reason: PAMReply.NoPushReason, now: Duration) {
        guard let prompt = prompts[id], !prompt.delivered else { return }
        endPrompt(id, reason, offerWhy: "the box's login prompt went away before Enter was pressed",
                  heldWhy: "the box's login prompt went away before Enter was pressed there", now: now)
    }

    /// The module is done with a prompt whose push was not delivered (the person typed a
    /// password, cancelled, or its process ended), or its connection closed.
    mutating func promptWentOn(_ id: UInt64, now: Duration) {
        endPrompt(id, .timedOut, offerWhy: "the box's login prompt went on without the phone before Enter was pressed",
                  heldWhy: "the box's login prompt went on without the phone (a password was typed there, or it closed) before Enter was pressed",
                  now: now)
    }

    /// A prompt ends with nothing delivered: the offer on it is withdrawn and the push held
    /// there dropped (their phones hear why), and an Enter waiting there is answered.
    private mutating func endPrompt(_ id: UInt64, _ reason: PAMReply.NoPushReason, offerWhy: String, heldWhy: String, now: Duration) {
        withdrawOffer(of: id, offerWhy, now: now)
        dropHeld(id, .notAtPrompt, heldWhy, now: now)
        endWait(id, reason)
        prompts.remove(id)
        readvertise()
    }

    /// Shutting down: every prompt closes, every Enter's wait ends.
    mutating func shutdown(now: Duration) {
        for id in Array(prompts.prompts.keys) { closePrompt(id, .shuttingDown, now: now) }
        for id in Array(waiting) { endWait(id, .shuttingDown) }
    }

    // MARK: - Time

    /// Runs every timeout that is due (handshakes, prompts, grace periods); returns the phones
    /// whose grace ran out, for the policy's lock or logout.
    mutating func tick(now: Duration) -> [WalkAway] {
        failedHandshakes.pruneAll(now: now)
        rejectedByPhone.pruneAll(now: now)
        rejectedByUser.pruneAll(now: now)
        rejectedNewPhones.pruneAll(now: now)
        for id in Array(links.keys) {
            if let link = links[id], link.hangUpWhenHeard, now >= hangUpDeadline(of: link) {
                log(.info, "\(id.address) never subscribed to hear why it was refused: hung up")
                hangUpNow(id)
            }
            guard var link = links[id], !link.dropped else { continue }
            do { try link.reassembler.checkTimeout(now: now) } catch {
                links[id] = link
                audit(.notice, .connectionRefused, "dropped \(id.address): stalled mid-message")
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
                withdrawOffer(of: prompt.id, "nobody pressed Enter at the box's prompt", now: now)
            } else {
                prompts[prompt.id]?.deadline = nil
            }
        }
        var away: [WalkAway] = []
        for (phone, grace) in graces where grace.deadline <= now {
            graces[phone] = nil
            away.append(WalkAway(phone: phone, user: grace.user, reason: grace.reason))
        }
        return away
    }

    /// An RSSI reading of a presence link (nil: the read failed, which is no sample); the
    /// walk-away it completes, if any. Each reading leaves one line in the journal: what it
    /// changed, the walk-away, or (debug) the reading itself.
    mutating func rssiSample(_ id: CentralID, _ rssi: Int?, now: Duration) -> WalkAway? {
        guard presences[id] != nil else { return nil }
        let change = presences[id]!.sample(rssi, now: now)
        let p = presences[id]!, s = p.settings
        let who = "phone \(p.phone.fingerprint) user \(logSafe(p.user))"
        switch change {
        case .weak(let mean)?:
            audit(.info, .presence, "signal weak: \(who): the mean of the last \(s.samples) readings is \(Int(mean.rounded())) dBm, below \(s.lockThreshold) dBm; walk-away in \(s.awayAfter) unless it comes back above \(s.returnThreshold) dBm", phone: p.phone.fingerprint, user: p.user)
        case .back(let mean)?:
            audit(.info, .presence, "signal back: \(who): the mean is \(Int(mean.rounded())) dBm, above \(s.returnThreshold) dBm; no walk-away", phone: p.phone.fingerprint, user: p.user)
        case nil:
            break
        }
        let away = checkPresence(id, now: now)
        if change == nil, away == nil {
            let mean = p.mean == 0 ? "no readings yet" : "mean \(Int(p.mean.rounded())) dBm"
            log(.debug, "RSSI of \(id): \(rssi.map { "\($0) dBm" } ?? "unreadable") (\(mean))")
        }
        return away
    }

    /// Whether presence link `id` says its phone walked away (keepalives stopped, the signal
    /// stayed weak): then the link ends, and the policy's lock or logout follows.
    mutating func checkPresence(_ id: CentralID, now: Duration) -> WalkAway? {
        guard let p = presences[id], let why = p.away(now: now) else { return nil }
        presences[id] = nil
        audit(.notice, .sessionAction, "walked away: phone \(p.phone.fingerprint) user \(logSafe(p.user)): \(why)", phone: p.phone.fingerprint, user: p.user)
        drop(id)
        readvertise()
        return WalkAway(phone: p.phone, user: p.user, reason: why)
    }

    /// The presence links whose RSSI should be read now (`PresenceService`).
    func presenceReadsDue(now: Duration) -> [CentralID] {
        presences.filter { $0.value.nextSample <= now }.map(\.key)
    }

    var nextPresenceRead: Duration? { presences.values.map(\.nextSample).min() }

    /// The earliest time anything needs attention, or nil when the box is idle.
    var nextDeadline: Duration? {
        var deadlines: [Duration] = []
        for link in links.values {
            if link.hangUpWhenHeard { deadlines.append(hangUpDeadline(of: link)) }
            guard !link.dropped else { continue }
            if let d = link.connection.nextDeadline { deadlines.append(d) }
            if let d = link.reassembler.deadline { deadlines.append(d) }
        }
        deadlines += prompts.prompts.values.compactMap(\.deadline)
        deadlines += graces.values.map(\.deadline)
        deadlines += presences.values.compactMap(\.keepaliveDeadline)
        return deadlines.min()
    }
}
