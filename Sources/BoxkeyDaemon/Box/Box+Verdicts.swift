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
    public func captured(_ id: UInt64, password: SecureBytes) { state.captured(id, password: password) }

    /// An escrow capture ended: the box's own service checks the typed password (when the
    /// stack accepted the login with one), then the state seals it or refuses.
    private func finishCapture(_ prompt: PromptTable.Prompt, _ v: PromptTable.Verifying, secret: SecureBytes,
                               verdict: PAMRequest.Verdict, who: String) async {
        var check: PAMVerifier.Verdict?
        if verdict != .rejected, let password = v.captured {
            check = await PAMVerifier(service: state.config.verifyService).verify(user: v.user, password: password)
        }
        state.sealCapture(prompt, v, secret: secret, verdict: verdict, check: check, who: who, now: clock.now)
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
        // Revoked (or its pending enrolment gone) while the password was checked: nothing is
        // unlocked for it.
        if state.registry.isRevoked(phone)
            || (!state.enrolledUsers(of: phone).contains(user) && state.enrolment.pendingEnrolment(of: phone, now: now) == nil) {
            audit.audit(.notice, .loginRejected, "login accepted, but phone \(phone.fingerprint) was revoked meanwhile: \(who); not unlocking \(logSafe(place))", phone: phone.fingerprint, user: user, service: state.config.verifyService)
            return finish(LoginResult(.rejected, reason: "this phone was revoked at box \(identity.boxID)"))
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

    /// `pam_sm_open_session`: logind's record of the session, for the state to register
    /// (`BoxState.sessionOpened`).
    public func openSession(user: String, sessionID: String, service: String, ticket: String) async {
        let uid = uid(of: user)
        var session: Result<LoginSession?, any Error> = .success(nil)
        if uid != nil {
            do { session = .success(try await sessions.session(id: sessionID)) } catch { session = .failure(error) }
        }
        state.sessionOpened(session, uid: uid, user: user, sessionID: sessionID, service: service, ticket: ticket, now: clock.now)
    }

    public func closeSession(sessionID: String) {
        state.registered.close(sessionID)
    }
}
