import BoxkeyCore
import BoxkeyRadio

/// Logins: a push checked against the phone's enrolment, the user's mode and the prompts; an
/// offer placed at a prompt; what an accepted login earns and a rejected one costs.
extension BoxState {
    mutating func startLogin(_ push: CredentialPush, from id: CentralID, now: Duration) {
        guard let phone = links[id]?.connection.phoneKey else { return }
        let user = push.user
        let who = "phone \(phone.fingerprint) (\(logSafe(push.deviceName))) user \(logSafe(user))"
        let enrolledFor = enrolledUsers(of: phone)
        let pending = enrolment.pendingEnrolment(of: phone, now: now)
        guard enrolledFor.contains(user) || (pending != nil && (pending!.user == nil || pending!.user == user) && mayEnrol(user)) else {
            audit(.notice, .pushRefused, "refused push: \(who): this phone is not enrolled for that user", phone: phone.fingerprint, user: user)
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
            audit(.notice, .pushRefused, "refused \(sent) login: \(who): a \(sent) login needs a phone enrolled for that user", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.wrongUser, reason: "this phone is not enrolled for \(user) at box \(identity.boxID)"), now: now)
            return
        }
        guard sent == mode else {
            audit(.notice, .pushRefused, "refused \(sent) login: \(who): the box is in \(mode) mode for this user", phone: phone.fingerprint, user: user)
            let reason = sent == .password
                ? "box \(identity.boxID) is in \(mode) mode for \(user): the phone must not hold the password (boxkey credentials set --\(mode == .key ? "key-only" : "escrow"))"
                : "box \(identity.boxID) does not take \(sent) logins for \(user) (it is in \(mode) mode)"
            finishLogin(on: id, LoginResult(.rejected, reason: reason), now: now)
            return
        }
        if rejectedByUser.isLimited(user, now: now) {
            audit(.notice, .pushRefused, "refused push: \(who): too many rejected pushes for this user", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.rejected, reason: "too many rejected pushes for \(user); try later"), now: now)
            return
        }
        if !enrolledFor.contains(user), rejectedNewPhones.isLimited(BoxState.newPhones, now: now) {
            audit(.notice, .pushRefused, "refused push: \(who): too many rejected pushes from new phones at this box", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.rejected, reason: "too many rejected pushes from new phones at box \(identity.boxID); try later"), now: now)
            return
        }
        switch prompts.choose(for: user) {
        case .prompt(let promptID) where kind == .key && !config.keyServices.contains(prompts[promptID]!.request.service):
            let service = prompts[promptID]!.request.service
            audit(.notice, .pushRefused, "refused key login: \(who): \(logSafe(service)) does not take key logins ([login] key_services)", phone: phone.fingerprint, user: user, service: service)
            finishLogin(on: id, LoginResult(.rejected, reason: "the box's \(service) prompt does not take key logins"), now: now)
        case .none where config.logindUnlock && kind != .password:
            // Unlocking through logind checks a pushed password with the box's own service; key
            // and escrow logins go to prompts only.
            audit(.notice, .pushRefused, "refused \(sent) login: \(who): box is not at a login prompt", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt"), now: now)
        case .none where config.logindUnlock:
            links[id]?.prompt = nil
            emit(.work(.unlockThroughLogind(push, phone: phone, link: id)))
        case .none:
            audit(.notice, .pushRefused, "refused push: \(who): box is not at a login prompt", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt"), now: now)
        case .otherUser:
            audit(.notice, .pushRefused, "refused push: \(who): the waiting prompt is for another user", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.wrongUser, reason: "the box's prompt is for another user"), now: now)
        case .namesNobody:
            audit(.notice, .pushRefused, "refused push: \(who): the waiting prompt names no user yet", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.notAtPrompt, reason: "the box's prompt names no user yet: type \(user) there first"), now: now)
        case .ambiguous(let candidates):
            audit(.notice, .pushRefused, "refused push: \(who): more than one prompt could take it (\(candidates.map(logSafe).joined(separator: "; ")))", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.ambiguousPrompt, reason: String("more than one prompt could take this push: \(candidates.joined(separator: "; "))".prefix(LoginResult.maxReasonLength))), now: now)
        case .prompt(let promptID) where prompts[promptID]!.offer.map { !($0.link == id && $0.user == user && $0.intent) } ?? false:
            // The person was asked about another phone (or has not answered yet): this prompt is not
            // free for any other push.
            audit(.notice, .pushRefused, "refused push: \(who): the prompt shows another phone's proximity offer", phone: phone.fingerprint, user: user)
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
        return PresenceMonitor(phone: phone, user: user, settings: presenceSettings, now: now)
    }

    var presenceSettings: PresenceMonitor.Settings {
        .init(keepaliveTimeout: config.keepaliveTimeout, rssiInterval: config.rssiInterval, samples: config.rssiSamples,
              lockThreshold: config.rssiLockThreshold, returnThreshold: config.rssiReturnThreshold, awayAfter: config.awayAfter)
    }

}
