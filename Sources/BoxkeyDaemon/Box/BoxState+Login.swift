import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio

/// Logins: a push checked against the phone's enrolment, the user's mode and the prompts; an
/// offer placed at a prompt; what an accepted login earns and a rejected one costs.
extension BoxState {
    /// A refused push: the audit line's subject ("push", "key login") and why, and what the
    /// phone hears.
    struct LoginRefusal {
        var what = "push"
        var why: String
        var result: LoginResult
    }

    mutating func startLogin(_ push: CredentialPush, from id: CentralID, now: Duration) {
        guard let phone = links[id]?.connection.phoneKey else { return }
        let user = push.user
        let who = "phone \(phone.fingerprint) (\(logSafe(push.deviceName))) user \(logSafe(user))"
        func refuse(_ r: LoginRefusal, service: String? = nil) {
            audit(.notice, .pushRefused, "refused \(r.what): \(who): \(r.why)", phone: phone.fingerprint, user: user, service: service)
            finishLogin(on: id, r.result, now: now)
        }
        if let refusal = loginRefusal(push, from: phone, now: now) { return refuse(refusal) }
        let sent = push.kind.mode
        if let taken = takeBackHeldPrompt(for: user, by: phone, on: id, now: now) { return refuse(taken) }
        switch prompts.choose(for: user) {
        case .prompt(let promptID) where push.kind == .key && !config.keyServices.contains(prompts[promptID]!.request.service):
            let service = prompts[promptID]!.request.service
            refuse(LoginRefusal(what: "key login", why: "\(logSafe(service)) does not take key logins ([login] key_services)",
                                result: LoginResult(.rejected, reason: "the box's \(service) prompt does not take key logins")), service: service)
        case .none where config.logindUnlock && push.kind != .password:
            // Unlocking through logind checks a pushed password with the box's own service; key
            // and escrow logins go to prompts only.
            refuse(LoginRefusal(what: "\(sent) login", why: "box is not at a login prompt",
                                result: LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt")))
        case .none where config.logindUnlock:
            links[id]?.prompt = nil
            emit(.work(.unlockThroughLogind(push, phone: phone, link: id)))
        case .none:
            refuse(LoginRefusal(why: "box is not at a login prompt", result: LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt")))
        case .otherUser:
            refuse(LoginRefusal(why: "the waiting prompt is for another user", result: LoginResult(.wrongUser, reason: "the box's prompt is for another user")))
        case .namesNobody:
            refuse(LoginRefusal(why: "the waiting prompt names no user yet",
                                result: LoginResult(.notAtPrompt, reason: "the box's prompt names no user yet: type \(user) there first")))
        case .ambiguous(let candidates):
            refuse(LoginRefusal(why: "more than one prompt could take it (\(candidates.map(logSafe).joined(separator: "; ")))",
                                result: LoginResult(.ambiguousPrompt, reason: String("more than one prompt could take this push: \(candidates.joined(separator: "; "))".prefix(LoginResult.maxReasonLength)))))
        case .prompt(let promptID) where prompts[promptID]!.offer.map { !($0.link == id && $0.user == user && $0.intent) } ?? false:
            // The person was asked about another phone (or has not answered yet): this prompt is not
            // free for any other push.
            refuse(LoginRefusal(why: "the prompt shows another phone's proximity offer",
                                result: LoginResult(.ambiguousPrompt, reason: "the box's prompt is showing another phone's offer")))
        case .prompt(let promptID):
            placeLogin(push, from: id, phone: phone, at: promptID, who: who, now: now)
        }
    }

    /// A prompt for `user` that holds another phone's push (waiting for Enter). A phone not
    /// enrolled for the user (pending) never keeps it from one that is: its push is dropped
    /// now, and `phone` may go on. Otherwise the refusal `phone` hears: the truth, not "not at a
    /// login prompt". Nil when no such prompt is in the way.
    mutating func takeBackHeldPrompt(for user: String, by phone: PublicKey, on id: CentralID, now: Duration) -> LoginRefusal? {
        if case .prompt = prompts.choose(for: user) { return nil }
        guard let held = prompts.prompts.values.first(where: {
            $0.request.expectedUser == user && $0.held != nil && $0.verifying.map { $0.link != id } ?? false
        }), let holder = held.verifying else { return nil }
        if enrolledUsers(of: phone).contains(user), !enrolledUsers(of: holder.phone).contains(user) {
            dropHeld(held.id, .notAtPrompt, "a phone enrolled for \(user) came to the same prompt, and a phone that is not cannot keep it from her", now: now)
            return nil
        }
        return LoginRefusal(why: "another phone's push (phone \(holder.phone.fingerprint)) waits for Enter at that prompt",
                            result: LoginResult(.notAtPrompt, reason: "another phone's push is waiting for Enter at box \(identity.boxID)'s prompt (\(held.description)); try again once it is used or gone"))
    }

    /// Why `phone` may not log `push.user` in at all, wherever the prompt: not enrolled for the
    /// user (nor pending for them), a mode that is not the user's, a spent rejection budget.
    mutating func loginRefusal(_ push: CredentialPush, from phone: PublicKey, now: Duration) -> LoginRefusal? {
        let user = push.user
        let enrolledFor = enrolledUsers(of: phone)
        let notEnrolled = LoginResult(.wrongUser, reason: "this phone is not enrolled for \(user) at box \(identity.boxID)")
        let pending = enrolment.pendingEnrolment(of: phone, now: now)
        guard enrolledFor.contains(user) || (pending != nil && (pending!.user == nil || pending!.user == user) && mayEnrol(user)) else {
            return LoginRefusal(why: "this phone is not enrolled for that user", result: notEnrolled)
        }
        // The mode the push is for must be the user's: a key or escrow login goes only where the
        // box put the user in that mode, and a password pushed for a key or escrow user is refused
        // (those modes exist so that the phone holds no password).
        let sent = push.kind.mode
        let mode = config.loginMode(for: user)
        // A key or escrow login has no password the box could check a pending phone by.
        guard sent == .password || enrolledFor.contains(user) else {
            return LoginRefusal(what: "\(sent) login", why: "a \(sent) login needs a phone enrolled for that user", result: notEnrolled)
        }
        guard sent == mode else {
            let reason = sent == .password
                ? "box \(identity.boxID) is in \(mode) mode for \(user): the phone must not hold the password (boxkey credentials set --\(mode == .key ? "key-only" : "escrow"))"
                : "box \(identity.boxID) does not take \(sent) logins for \(user) (it is in \(mode) mode)"
            return LoginRefusal(what: "\(sent) login", why: "the box is in \(mode) mode for this user", result: LoginResult(.rejected, reason: reason))
        }
        if rejectedByUser.isLimited(user, now: now) {
            return LoginRefusal(why: "too many rejected pushes for this user", result: LoginResult(.rejected, reason: "too many rejected pushes for \(user); try later"))
        }
        // A phone not enrolled for the user whose pushes were left waiting at her prompt, with
        // nobody pressing Enter, is not let hold it again and again.
        if !enrolledFor.contains(user), heldUnusedByPhone.isLimited(phone, now: now) {
            return LoginRefusal(why: "its last \(BoxState.heldUnusedPerPhone) pushes were left waiting with nobody pressing Enter",
                                result: LoginResult(.rejected, reason: "this phone's last pushes to box \(identity.boxID) waited with nobody pressing Enter; try later, at the box"))
        }
        if !enrolledFor.contains(user), rejectedNewPhones.isLimited(BoxState.newPhones, now: now) {
            return LoginRefusal(why: "too many rejected pushes from new phones at this box",
                                result: LoginResult(.rejected, reason: "too many rejected pushes from new phones at box \(identity.boxID); try later"))
        }
        return nil
    }

    /// The push goes to the one prompt that may take it: held there until Enter, or delivered at
    /// once if Enter was already pressed at this phone's offer. Escrow: the sealed copy opens
    /// with the phone's secret, or the person types the password at this prompt to make one.
    mutating func placeLogin(_ push: CredentialPush, from id: CentralID, phone: PublicKey, at promptID: UInt64, who: String, now: Duration) {
        let user = push.user, kind = push.kind, sent = push.kind.mode
        let enrolledFor = enrolledUsers(of: phone)
        var password = push.password
        var escrowUse: PromptTable.Escrow?
        if kind == .escrow, let secret = push.escrowSecret {
            if let sealed = escrow.sealed(phone: phone, user: user) {
                do {
                    password = try EscrowSeal.open(sealed, secret: secret, boxKey: identity.keyPair.publicKey, phoneKey: phone, user: user)
                    escrowUse = .opened(password: password)
                } catch {
                    // Not this phone's secret any more (the phone set a new one): the copy is useless.
                    _ = try? escrow.destroy(phone: phone.fingerprint, user: user)
                    recordRejection(phone, user: user, now: now)
                    audit(.notice, .pushRefused, "refused escrow login: \(who): the sealed password does not open with the phone's secret; destroyed it", phone: phone.fingerprint, user: user)
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
        audit(.info, .loginAttempt, "\(attempt) attempt: \(who) into \(logSafe(prompts[promptID]!.description))", phone: phone.fingerprint, user: user, service: prompts[promptID]!.request.service)
        let answer: PromptAnswer = switch (kind, escrowUse) {
        case (.key, _): .keyLogin(user: user, ticket: ticket)
        case (.escrow, .capture?): .escrowCapture(user: user, ticket: ticket)
        default: .push(user: user, password: password, ticket: ticket)
        }
        if let offer = prompts[promptID]!.offer, offer.intent, offer.link == id, prompts[promptID]!.entered, waiting.contains(promptID) {
            // Enter was pressed at this phone's offer: its push is what the person asked for.
            deliver(answer, to: promptID, now: now)
        } else {
            // The module is inside the program's password prompt: the push waits for Enter
            // there, and the phone hears where.
            prompts[promptID]!.held = answer
            prompts[promptID]!.deadline = now + config.enterWait
            let place = prompts[promptID]!.description
            log(.info, "push held at \(logSafe(place)) (pid \(prompts[promptID]!.pid)): waiting \(config.enterWait.components.seconds) s for Enter there")
            guard var connection = links[id]?.connection else { return }
            let output = connection.holdLogin(EnterWait(seconds: UInt16(clamping: config.enterWait.components.seconds), place: place))
            links[id]?.connection = connection
            perform(output, for: id, now: now)
        }
        readvertise()
    }

    /// Hands a push to the module at `promptID` (Enter was pressed): the stack verifies it now.
    mutating func deliver(_ answer: PromptAnswer, to promptID: UInt64, now: Duration) {
        prompts[promptID]?.held = nil
        prompts[promptID]?.delivered = true
        prompts[promptID]?.entered = false
        prompts[promptID]?.deadline = now + config.outcomeTimeout
        if waiting.remove(promptID) != nil { emit(.answer(prompt: promptID, answer)) }
    }

    /// A held push that will not be delivered (no Enter in time, the prompt went on without the
    /// phone, the phone left): the phone hears why, its ticket is spent, and the prompt is open
    /// again. Not a rejection: nothing was verified.
    mutating func dropHeld(_ promptID: UInt64, _ outcome: LoginResult.Outcome, _ why: String, now: Duration) {
        guard let prompt = prompts[promptID], prompt.held != nil, let v = prompt.verifying else { return }
        // Not a rejection (nothing was verified), but a phone not enrolled for the user whose
        // push sat at her prompt unused is counted: it cannot hold her prompt over and over.
        if outcome == .timedOut || outcome == .notAtPrompt || outcome == .withdrawn, !enrolledUsers(of: v.phone).contains(v.user) {
            heldUnusedByPhone.record(v.phone, now: now)
        }
        prompts[promptID]!.held = nil
        prompts[promptID]!.verifying = nil
        prompts[promptID]!.deadline = nil
        prompts[promptID]!.waiting = true
        _ = registered.redeem(v.ticket, user: v.user, now: now)
        if links[v.link]?.prompt == promptID { links[v.link]?.prompt = nil }
        audit(.notice, .loginRejected, "push not used: phone \(v.phone.fingerprint) user \(logSafe(v.user)) at \(logSafe(prompt.description)): \(why)",
                    phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
        finishLogin(on: v.link, LoginResult(outcome, reason: String(why.prefix(LoginResult.maxReasonLength))), now: now)
        readvertise()
    }

    /// Whether the phone of a push held at a prompt may still log its user in: enrolled for that
    /// user, or (a password push) still waiting for its enrolment. Asked again when Enter
    /// delivers the push: a revocation between the push and Enter, here or in the directory,
    /// wins.
    mutating func mayStillDeliver(_ v: PromptTable.Verifying, now: Duration) -> Bool {
        guard !registry.isRevoked(v.phone) else { return false }
        return enrolledUsers(of: v.phone).contains(v.user)
            || (v.pendingPassword != nil && enrolment.pendingEnrolment(of: v.phone, now: now) != nil)
    }

    /// A phone lost users (`keeping`: those it still has; empty: all of them): its pushes held
    /// for the others are dropped, and it hears why.
    mutating func dropHeldPushes(of phone: PublicKey, keeping users: [String], reason: String, now: Duration) {
        for prompt in prompts.prompts.values where prompt.held != nil {
            guard let v = prompt.verifying, v.phone == phone, users.isEmpty || !users.contains(v.user) else { continue }
            dropHeld(prompt.id, .wrongUser, "\(reason) (no longer enrolled for \(logSafe(v.user)) at box \(identity.boxID))", now: now)
        }
    }

    /// The phone took its push back (Ctrl-C in `boxkey login`, `agent forget`, `boxkey lock`,
    /// the agent's client gone): dropped at once if it still waits for Enter, and the phone
    /// hears `withdrawn`. Once Enter took it, the stack's verdict answers as usual.
    mutating func withdrawPush(on id: CentralID, now: Duration) {
        guard let promptID = links[id]?.prompt, prompts[promptID]?.held != nil, prompts[promptID]?.verifying?.link == id else {
            log(.info, "\(id.address) asked to withdraw its push, which Enter had already taken (or none was held)")
            return
        }
        dropHeld(promptID, .withdrawn, "the phone withdrew it before Enter was pressed at the box", now: now)
    }

    // MARK: - Proximity

    /// An enrolled phone is near and offers to log `offer.user` in: the one prompt that may take
    /// that user shows it ("press Enter"), and nothing happens until the person asks there.
    mutating func startOffer(_ offer: ProximityOffer, from id: CentralID, now: Duration) {
        guard let phone = links[id]?.connection.phoneKey else { return }
        let user = offer.user
        let who = "phone \(phone.fingerprint) (\(logSafe(offer.deviceName))) user \(logSafe(user))"
        func refuse(_ outcome: LoginResult.Outcome, _ why: String, _ reason: String) {
            audit(.notice, .pushRefused, "refused proximity offer: \(who): \(why)", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(outcome, reason: reason), now: now)
        }
        guard config.proximity else { return refuse(.notAtPrompt, "proximity login is off ([login] proximity)", "box \(identity.boxID) does not take proximity logins") }
        guard enrolledUsers(of: phone).contains(user) else {
            return refuse(.wrongUser, "a proximity offer needs a phone enrolled for that user", "this phone is not enrolled for \(user) at box \(identity.boxID)")
        }
        guard !rejectedByUser.isLimited(user, now: now) else { return refuse(.rejected, "too many rejected pushes for this user", "too many rejected pushes for \(user); try later") }
        if let taken = takeBackHeldPrompt(for: user, by: phone, on: id, now: now) {
            return refuse(taken.result.outcome, taken.why, taken.result.reason)
        }
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
            return refuse(.rejected, "\(BoxState.offersPerPhone) offers in 5 minutes", "too many proximity offers from this phone; try later or use boxkey login")
        }
        offersByPhone.record(phone, now: now)
        // The prompt stays open: another phone's push or offer there is refused by name.
        prompts[promptID]!.offer = .init(link: id, phone: phone, user: user)
        // The person's time to see it and press Enter.
        prompts[promptID]!.deadline = now + config.maxPromptWait
        links[id]?.prompt = promptID
        audit(.info, .loginAttempt, "proximity offer: \(who) at \(logSafe(prompts[promptID]!.description)) (pid \(prompts[promptID]!.pid)); waiting for Enter there", phone: phone.fingerprint, user: user, service: prompts[promptID]!.request.service)
        readvertise()
        wakeTimers()
    }

    /// The person pressed Enter at a prompt holding an offer: the phone pushes now, and the
    /// prompt takes that push at once. False when the offering phone is gone.
    mutating func giveIntent(_ promptID: UInt64, now: Duration) -> Bool {
        guard var offer = prompts[promptID]?.offer, !offer.intent, var link = links[offer.link] else {
            let free = prompts[promptID]?.verifying == nil
            prompts[promptID]?.offer = nil
            prompts[promptID]?.waiting = free
            return false
        }
        offer.intent = true
        prompts[promptID]!.offer = offer
        prompts[promptID]!.waiting = true
        prompts[promptID]!.deadline = now + config.commandTimeout
        audit(.info, .loginAttempt, "proximity intent: Enter pressed at \(logSafe(prompts[promptID]!.description)) for phone \(offer.phone.fingerprint) user \(logSafe(offer.user))", phone: offer.phone.fingerprint, user: offer.user)
        let output = link.connection.giveIntent(now: now)
        links[offer.link] = link
        perform(output, for: offer.link, now: now)
        return true
    }

    /// A prompt with an offer went away (timed out, cancelled, another took its place): the
    /// offering phone hears so, unless it already pushed.
    mutating func withdrawOffer(of promptID: UInt64, _ why: String, now: Duration) {
        guard let offer = prompts[promptID]?.offer, prompts[promptID]?.verifying == nil else { return }
        prompts[promptID]!.offer = nil
        prompts[promptID]!.waiting = true
        prompts[promptID]!.deadline = nil
        finishLogin(on: offer.link, LoginResult(.notAtPrompt, reason: why), now: now)
        readvertise()
    }

    /// What an accepted push earns, and only that: enrolment of a pending phone for this user,
    /// the login on record, the session it unlocked bound to the phone, and its presence link.
    mutating func credit(_ phone: PublicKey, user: String, name: String, on link: CentralID, session: LoginSession?,
                        service: String, now: Duration) {
        if !enrolledUsers(of: phone).contains(user), mayEnrol(user) {
            do {
                try registry.enrol(phone, user: user, name: name, by: "pairing code")
                audit(.notice, .enrolled, "enrolled: phone \(phone.fingerprint) (\(logSafe(name))) for user \(logSafe(user)) by its first login under a pairing code", phone: phone.fingerprint, user: user)
                publishToFleet(phone, user: user, name: name)
            } catch {
                log(.error, "cannot enrol phone \(phone.fingerprint): \(error)")
            }
        }
        enrolment.settle(phone)
        try? registry.recordLogin(phone, name: name)
        if let session { registered.register(session, service: service, phone: phone) }
        lockedUsers.remove(user)
        // A link the box has hung up on (revoked, dropped) holds no presence, even before its
        // disconnection is reported.
        if let live = links[link], !live.dropped {
            presences[link] = startedPresence(phone: phone, user: user, now: now)
            graces[phone] = nil
        } else {
            // The phone left between its push and the verdict: no presence link holds this
            // session, so it is treated as walked away (the grace lets the phone come back).
            startGrace(phone: phone, user: user, reason: "link lost before the login was accepted", now: now)
        }
    }

    /// Revoked, or neither enrolled for `user` nor pending: what let a phone in before a wait
    /// (the stack's, the box's own check) may be gone after it.
    mutating func lostTrust(_ phone: PublicKey, for user: String, now: Duration) -> Bool {
        registry.isRevoked(phone) || (!enrolledUsers(of: phone).contains(user) && enrolment.pendingEnrolment(of: phone, now: now) == nil)
    }

    /// A push the stack did not accept from this phone counts against the phone, and against
    /// the user only if the phone is enrolled for that user. New phones (pending, paired with a
    /// code read off the screen) share one budget of their own at this box, so no number of them
    /// can spend an enrolled user's.
    mutating func recordRejection(_ phone: PublicKey, user: String, now: Duration) {
        rejectedByPhone.record(phone, now: now)
        if enrolledUsers(of: phone).contains(user) {
            rejectedByUser.record(user, now: now)
        } else {
            rejectedNewPhones.record(BoxState.newPhones, now: now)
        }
    }

    mutating func finishLogin(on id: CentralID, _ result: LoginResult, now: Duration) {
        guard var connection = links[id]?.connection else { return }
        let output = connection.finishLogin(result)
        links[id]?.connection = connection
        perform(output, for: id, now: now)
    }

    /// After an explicit lock or logout the phone's presence links have nothing left to guard.
    /// The phone's presence ends (no walk-away follows). Its links are dropped, except `asker`:
    /// a lock asked for over the presence link itself is answered on it (the phone closes it).
    mutating func endPresence(of phone: PublicKey, except asker: CentralID) {
        for (id, p) in presences where p.phone == phone {
            presences[id] = nil
            if id != asker { drop(id) }
        }
        graces[phone] = nil
    }

    mutating func startGrace(phone: PublicKey, user: String, reason: String, now: Duration) {
        guard config.policy != .none else { return }
        graces[phone] = Grace(user: user, deadline: now + config.grace, reason: reason)
        wakeTimers()
    }

    /// A new presence link: the presence service starts reading its RSSI.
    mutating func startedPresence(phone: PublicKey, user: String, now: Duration) -> PresenceMonitor {
        emit(.presenceChanged)
        wakeTimers()
        audit(.info, .presence, "presence link up: phone \(phone.fingerprint) user \(logSafe(user)); walk-away on link loss, missed keepalives or a weak signal", phone: phone.fingerprint, user: user)
        return PresenceMonitor(phone: phone, user: user, settings: presenceSettings, now: now)
    }

    var presenceSettings: PresenceMonitor.Settings {
        .init(keepaliveTimeout: config.keepaliveTimeout, rssiInterval: config.rssiInterval, samples: config.rssiSamples,
              lockThreshold: config.rssiLockThreshold, returnThreshold: config.rssiReturnThreshold, awayAfter: config.awayAfter)
    }

    /// The PAM stack's verdict on a push at `prompt`, once the box's own checks ran: credit
    /// for the phone only if the stack accepted the password it pushed and the phone is still
    /// enrolled (or pending) for the user.
    mutating func settle(_ verdict: PAMRequest.Verdict, reason: String, of prompt: PromptTable.Prompt, _ v: PromptTable.Verifying,
                         who: String, now: Duration) {
        if verdict == .accepted, lostTrust(v.phone, for: v.user, now: now) {
            // Revoked while the stack or the box's own check ran: no credit, no presence link.
            audit(.notice, .loginRejected, "login completed, but phone \(v.phone.fingerprint) was revoked meanwhile: \(who); no credit", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
            _ = registered.redeem(v.ticket, user: v.user, now: now)
            finishLogin(on: v.link, LoginResult(.rejected, reason: "this phone was revoked at box \(identity.boxID)"), now: now)
            return
        }
        switch verdict {
        case .accepted:
            audit(.info, .loginAccepted, "login accepted: \(who)", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
            // A locker in the user's own session: that session is the one this push unlocked.
            let own = prompt.owner.flatMap { $0.sessionClass != "greeter" && $0.user == v.user ? $0 : nil }
            credit(v.phone, user: v.user, name: v.name, on: v.link, session: own, service: prompt.request.service, now: now)
            finishLogin(on: v.link, LoginResult(.accepted, reason: String(prompt.description.prefix(LoginResult.maxReasonLength))), now: now)
            readvertise()
        case .acceptedOther:
            audit(.notice, .loginRejected, "login completed without the phone's password: \(who); the phone gets no credit", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
            _ = registered.redeem(v.ticket, user: v.user, now: now)
            recordRejection(v.phone, user: v.user, now: now)
            finishLogin(on: v.link, LoginResult(.rejected, reason: "the box logged in with a password typed at the keyboard, not the one this phone pushed"), now: now)
        case .rejected:
            _ = registered.redeem(v.ticket, user: v.user, now: now)
            recordRejection(v.phone, user: v.user, now: now)
            audit(.notice, .loginRejected, "login rejected: \(who): \(logSafe(reason))", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
            finishLogin(on: v.link, LoginResult(.rejected, reason: reason.isEmpty ? "the password was not accepted" : String(reason.prefix(LoginResult.maxReasonLength))), now: now)
        }
    }
}

extension CredentialPush.Kind {
    /// The login mode a push of this kind is for.
    var mode: DaemonConfig.LoginMode {
        switch self {
        case .password: .password
        case .key: .key
        case .escrow: .escrow
        }
    }
}
