import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio
import Logging

/// What the PAM stack and the box's own password check decide about a push that reached a
/// prompt (or a locked session through logind), and the sessions the stack opens: these wait
/// on PAM and logind, so they run here, around the state's decisions.
extension Box {
    /// The PAM stack's verdict on a push. Credit — "accepted", enrolment, a presence link —
    /// only when the password the stack verified is the one the phone pushed.
    public func report(_ id: UInt64, _ verdict: PAMRequest.Verdict, reason: String) async {
        guard let prompt = state.prompts[id], let v = prompt.verifying else { return }
        state.prompts.remove(id)
        let who = "phone \(v.phone.fingerprint) (\(logSafe(v.name))) user \(logSafe(v.user)) via \(logSafe(prompt.description))"
        if case .capture(let secret)? = v.escrow {
            await finishCapture(prompt, v, secret: secret, verdict: verdict, who: who)
            return
        }
        if case .opened(let password)? = v.escrow, verdict != .accepted {
            _ = state.registered.redeem(v.ticket, user: v.user, now: clock.now)
            state.recordRejection(v.phone, user: v.user, now: clock.now)
            // Stale only if the box's own password-only service refuses it too: the stack's
            // "no" may be a locked account, a directory outage, a cancelled or one-time-code prompt.
            let check = await PAMVerifier(service: state.config.verifyService).verify(user: v.user, password: password)
            if case .rejected(let why) = check {
                try? state.escrow.destroy(phone: v.phone.fingerprint, user: v.user)
                audit.audit(.notice, .loginRejected, "escrow login rejected: \(who): \(logSafe(reason)); \(logSafe(state.config.verifyService)) refuses the sealed password too (\(logSafe(why))): destroyed it", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
                state.finishLogin(on: v.link, LoginResult(.rejected, reason: "the sealed password was not accepted (changed?): log in once with it typed at the box, this phone near"), now: clock.now)
            } else {
                audit.audit(.notice, .loginRejected, "escrow login not accepted: \(who): \(logSafe(reason)); the sealed password still checks out, kept", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
                state.finishLogin(on: v.link, LoginResult(.rejected, reason: reason.isEmpty ? "the login was not accepted" : String(reason.prefix(LoginResult.maxReasonLength))), now: clock.now)
            }
            return
        }
        var verdict = verdict
        if verdict == .accepted, let password = v.pendingPassword {
            // A pending phone is enrolled only once the box itself confirms its password.
            let check = await PAMVerifier(service: state.config.verifyService).verify(user: v.user, password: password)
            if case .rejected(let why) = check {
                audit.audit(.notice, .loginRejected, "not enrolling: \(who): the box's own check (\(logSafe(state.config.verifyService))) did not confirm the pushed password: \(logSafe(why))", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
                verdict = .acceptedOther
            }
        }
        state.settle(verdict, reason: reason, of: prompt, v, who: who, now: clock.now)
    }

    /// The module's copy of the password typed at an escrow capture prompt (before its report).
    public func captured(_ id: UInt64, password: SecureBytes) {
        guard case .capture? = state.prompts[id]?.verifying?.escrow else { return }
        state.prompts[id]!.verifying!.captured = password
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
            state.recordRejection(v.phone, user: v.user, now: clock.now)
            _ = state.registered.redeem(v.ticket, user: v.user, now: clock.now)
            audit.audit(.notice, .loginRejected, "not sealing: \(who): \(why)", phone: v.phone.fingerprint, user: v.user, service: service)
            state.finishLogin(on: v.link, LoginResult(.rejected, reason: reason), now: clock.now)
        }
        guard verdict != .rejected else { return refuse("the login was not accepted", "the login at the box was not accepted; nothing was sealed") }
        guard let password = v.captured else {
            return refuse("the stack accepted the login without a typed password", "the box logged in without a typed password; nothing was sealed")
        }
        let check = await PAMVerifier(service: state.config.verifyService).verify(user: v.user, password: password)
        if case .rejected(let why) = check {
            return refuse("the box's own check (\(logSafe(state.config.verifyService))) did not confirm the typed password: \(logSafe(why))",
                          "the box could not confirm the typed password; nothing was sealed")
        }
        // Revoked (or unenrolled) while the check ran: nothing is sealed for it.
        guard state.enrolledUsers(of: v.phone).contains(v.user) else {
            return refuse("phone \(v.phone.fingerprint) was revoked while the password was checked", "this phone was revoked at box \(identity.boxID); nothing was sealed")
        }
        let sealed = EscrowSeal.seal(password: password, secret: secret, boxKey: identity.keyPair.publicKey, phoneKey: v.phone, user: v.user)
        do { try state.escrow.keep(sealed, phone: v.phone, user: v.user) } catch {
            logger.error("cannot keep the sealed password: \(error)")
            return refuse("cannot write the sealed copy (\(error))", "the box could not store the sealed password")
        }
        let now = clock.now
        audit.audit(.notice, .loginAccepted, "login accepted: \(who); the typed password is sealed for this phone (escrow)", phone: v.phone.fingerprint, user: v.user, service: service)
        let own = prompt.owner.flatMap { $0.sessionClass != "greeter" && $0.user == v.user ? $0 : nil }
        state.credit(v.phone, user: v.user, name: v.name, on: v.link, session: own, service: service, now: now)
        state.finishLogin(on: v.link, LoginResult(.accepted, reason: String("\(prompt.description); password sealed for this phone".prefix(LoginResult.maxReasonLength))), now: now)
        state.readvertise()
    }

    /// No prompt waits, but a screen locker running as the user may: if logind says the user
    /// has exactly one locked local session, verify the pushed password through the box's own
    /// PAM service and unlock that session through logind (`[unlock]`).
    func unlockThroughLogind(_ push: CredentialPush, phone: PublicKey, on id: CentralID) async {
        let user = push.user
        let who = "phone \(phone.fingerprint) (\(logSafe(push.deviceName))) user \(logSafe(user))"
        func finish(_ result: LoginResult) { state.finishLogin(on: id, result, now: clock.now) }
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
        audit.audit(.info, .loginAttempt, "login attempt: \(who) into \(logSafe(state.config.verifyService)) to unlock \(logSafe(place)) through logind", phone: phone.fingerprint, user: user, service: state.config.verifyService)
        let verdict = await PAMVerifier(service: state.config.verifyService).verify(user: user, password: push.password)
        let now = clock.now
        guard verdict == .accepted else {
            state.recordRejection(phone, user: user, now: now)
            let reason = if case .rejected(let r) = verdict { r } else { "" }
            audit.audit(.notice, .loginRejected, "login rejected: \(who) via \(logSafe(state.config.verifyService)): \(logSafe(reason))", phone: phone.fingerprint, user: user, service: state.config.verifyService)
            return finish(LoginResult(.rejected, reason: reason.isEmpty ? "the password was not accepted" : String(reason.prefix(LoginResult.maxReasonLength))))
        }
        do { try await sessions.unlock(session: session.id) } catch {
            logger.error("logind did not unlock \(logSafe(place)): \(error)")
            return finish(LoginResult(.timedOut, reason: "the password was accepted, but logind did not unlock the session"))
        }
        audit.audit(.info, .loginAccepted, "login accepted: \(who) via \(logSafe(state.config.verifyService)); unlocked \(logSafe(place)) through logind", phone: phone.fingerprint, user: user, service: state.config.verifyService)
        state.credit(phone, user: user, name: push.deviceName, on: id, session: session, service: state.config.verifyService, now: now)
        finish(LoginResult(.accepted, reason: String("\(place) unlocked through logind".prefix(LoginResult.maxReasonLength))))
        state.readvertise()
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
        let phone = state.registered.redeem(ticket, user: user, now: clock.now)
        state.registered.register(session, service: service, phone: phone)
        audit.audit(.info, .sessionRegistered, "session \(logSafe(sessionID)) (\(logSafe(user)), \(logSafe(session.place))) registered by \(logSafe(service))\(phone.map { " for phone \($0.fingerprint)" } ?? "")",
                    phone: phone?.fingerprint, user: user, service: service)
    }

    public func closeSession(sessionID: String) {
        state.registered.close(sessionID)
    }
}
