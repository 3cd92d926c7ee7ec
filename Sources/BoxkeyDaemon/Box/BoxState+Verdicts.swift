import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio

/// A password the box's own PAM service (`[unlock] verify_service`) must check before a
/// decision can go on, and what the decision does with the answer (`BoxState.checked`). The
/// check waits on PAM, so `Box` runs it between the two decisions.
struct PasswordCheck: Sendable {
    var user: String
    var password: SecureBytes
    /// The PAM service that checks it, as configured when the check was asked for.
    var service: String
    var then: Then

    func run() async -> PAMVerifier.Verdict { await PAMVerifier(service: service).verify(user: user, password: password) }

    enum Then: Sendable {
        /// An escrow capture the stack accepted: seal the typed password if it checks out.
        case seal(PromptTable.Prompt, PromptTable.Verifying, secret: SecureBytes, verdict: PAMRequest.Verdict, who: String)
        /// The stack refused a sealed password: destroy it only if the box refuses it too.
        case sealedRefused(PromptTable.Prompt, PromptTable.Verifying, reason: String, who: String)
        /// A pending phone's login the stack accepted: enrol only if this was its password.
        case confirmEnrolment(PromptTable.Prompt, PromptTable.Verifying, reason: String, who: String)
        /// No prompt, one locked session (`[unlock] logind_unlock`): unlock it if accepted.
        case unlock(CredentialPush, phone: PublicKey, link: CentralID, session: LoginSession)
    }
}

/// The PAM stack's verdict on a push, and a push with no prompt that unlocks a locked session
/// through logind: what the box decides before and after its own password check.
extension BoxState {
    /// The PAM stack's verdict on the push at prompt `id`: settled now, or after the box's own
    /// check of a password (returned). Credit — "accepted", enrolment, a presence link — only
    /// when the password the stack verified is the one the phone pushed.
    mutating func report(_ id: UInt64, _ verdict: PAMRequest.Verdict, reason: String, now: Duration) -> PasswordCheck? {
        guard let prompt = prompts[id], let v = prompt.verifying else { return nil }
        prompts.remove(id)
        let who = "phone \(v.phone.fingerprint) (\(logSafe(v.name))) user \(logSafe(v.user)) via \(logSafe(prompt.description))"
        switch v.escrow {
        case .capture(let secret)?:
            guard verdict != .rejected, let password = v.captured else {
                sealCapture(prompt, v, secret: secret, verdict: verdict, check: nil, who: who, now: now)
                return nil
            }
            return PasswordCheck(user: v.user, password: password, service: config.verifyService, then: .seal(prompt, v, secret: secret, verdict: verdict, who: who))
        case .opened(let password)? where verdict != .accepted:
            _ = registered.redeem(v.ticket, user: v.user, now: now)
            recordRejection(v.phone, user: v.user, now: now)
            // Stale only if the box's own password-only service refuses it too: the stack's
            // "no" may be a locked account, a directory outage, a cancelled or one-time-code prompt.
            return PasswordCheck(user: v.user, password: password, service: config.verifyService, then: .sealedRefused(prompt, v, reason: reason, who: who))
        default:
            // A pending phone is enrolled only once the box itself confirms its password.
            if verdict == .accepted, let password = v.pendingPassword {
                return PasswordCheck(user: v.user, password: password, service: config.verifyService, then: .confirmEnrolment(prompt, v, reason: reason, who: who))
            }
            settle(verdict, reason: reason, of: prompt, v, who: who, now: now)
            return nil
        }
    }

    /// The box's own check answered. Returns the session logind must unlock, if any.
    mutating func checked(_ check: PasswordCheck, _ answer: PAMVerifier.Verdict, now: Duration) -> LoginSession? {
        switch check.then {
        case .seal(let prompt, let v, let secret, let verdict, let who):
            sealCapture(prompt, v, secret: secret, verdict: verdict, check: answer, who: who, now: now)
        case .sealedRefused(let prompt, let v, let reason, let who):
            let service = prompt.request.service
            if case .rejected(let why) = answer {
                _ = try? escrow.destroy(phone: v.phone.fingerprint, user: v.user)
                audit(.notice, .loginRejected, "escrow login rejected: \(who): \(logSafe(reason)); \(logSafe(config.verifyService)) refuses the sealed password too (\(logSafe(why))): destroyed it", phone: v.phone.fingerprint, user: v.user, service: service)
                finishLogin(on: v.link, LoginResult(.rejected, reason: "the sealed password was not accepted (changed?): log in once with it typed at the box, this phone near"), now: now)
            } else {
                audit(.notice, .loginRejected, "escrow login not accepted: \(who): \(logSafe(reason)); the sealed password still checks out, kept", phone: v.phone.fingerprint, user: v.user, service: service)
                finishLogin(on: v.link, LoginResult(.rejected, reason: reason.isEmpty ? "the login was not accepted" : String(reason.prefix(LoginResult.maxReasonLength))), now: now)
            }
        case .confirmEnrolment(let prompt, let v, let reason, let who):
            var verdict = PAMRequest.Verdict.accepted
            if answer != .accepted {
                let why = if case .rejected(let r) = answer { r } else { "" }
                audit(.notice, .loginRejected, "not enrolling: \(who): the box's own check (\(logSafe(config.verifyService))) did not confirm the pushed password: \(logSafe(why))", phone: v.phone.fingerprint, user: v.user, service: prompt.request.service)
                verdict = .acceptedOther
            }
            settle(verdict, reason: reason, of: prompt, v, who: who, now: now)
        case .unlock(let push, let phone, let id, let session):
            return unlockChecked(push, phone: phone, on: id, session: session, answer, now: now)
        }
        return nil
    }

    // MARK: - Unlock through logind

    /// A push with no prompt open (`[unlock] logind_unlock`): the uid whose sessions logind must
    /// list, or nil when refused here (the phone is told).
    mutating func unlockUID(_ push: CredentialPush, phone: PublicKey, on id: CentralID, now: Duration) -> UInt32? {
        guard let uid = userID(push.user) else {
            audit(.notice, .pushRefused, "refused push: \(unlocking(push, phone)): no such user", phone: phone.fingerprint, user: push.user)
            finishLogin(on: id, notAtPrompt, now: now)
            return nil
        }
        return uid
    }

    /// logind listed the user's sessions: if exactly one local one is locked, its password is
    /// checked (returned); else the phone is told why not.
    mutating func unlockTarget(_ sessions: Result<[LoginSession], any Error>, _ push: CredentialPush, phone: PublicKey,
                               on id: CentralID, now: Duration) -> PasswordCheck? {
        let (user, who) = (push.user, unlocking(push, phone))
        let locked: [LoginSession]
        switch sessions {
        case .success(let all): locked = all.filter { $0.isLocal && $0.locked && $0.sessionClass == "user" }
        case .failure(let error):
            audit(.warning, .pushRefused, "refused push: \(who): logind did not answer (\(error))", phone: phone.fingerprint, user: user)
            finishLogin(on: id, notAtPrompt, now: now)
            return nil
        }
        guard let session = locked.first else {
            audit(.notice, .pushRefused, "refused push: \(who): box is not at a login prompt and \(logSafe(user)) has no locked local session", phone: phone.fingerprint, user: user)
            finishLogin(on: id, notAtPrompt, now: now)
            return nil
        }
        guard locked.count == 1 else {
            audit(.notice, .pushRefused, "refused push: \(who): \(locked.count) locked sessions could take it", phone: phone.fingerprint, user: user)
            finishLogin(on: id, LoginResult(.ambiguousPrompt, reason: String("more than one locked session: \(locked.map(\.place).joined(separator: "; "))".prefix(LoginResult.maxReasonLength))), now: now)
            return nil
        }
        audit(.info, .loginAttempt, "login attempt: \(who) into \(logSafe(config.verifyService)) to unlock \(logSafe(place(session))) through logind", phone: phone.fingerprint, user: user, service: config.verifyService)
        return PasswordCheck(user: user, password: push.password, service: config.verifyService, then: .unlock(push, phone: phone, link: id, session: session))
    }

    /// The box's check of the password answered: the session to unlock, or nil (the phone told).
    private mutating func unlockChecked(_ push: CredentialPush, phone: PublicKey, on id: CentralID, session: LoginSession,
                                        _ answer: PAMVerifier.Verdict, now: Duration) -> LoginSession? {
        let (user, who) = (push.user, unlocking(push, phone))
        guard answer == .accepted else {
            let reason = if case .rejected(let r) = answer { r } else { "" }
            recordRejection(phone, user: user, now: now)
            audit(.notice, .loginRejected, "login rejected: \(who) via \(logSafe(config.verifyService)): \(logSafe(reason))", phone: phone.fingerprint, user: user, service: config.verifyService)
            finishLogin(on: id, LoginResult(.rejected, reason: reason.isEmpty ? "the password was not accepted" : String(reason.prefix(LoginResult.maxReasonLength))), now: now)
            return nil
        }
        // Revoked (or its pending enrolment gone) while the password was checked: nothing is
        // unlocked for it.
        if lostTrust(phone, for: user, now: now) {
            audit(.notice, .loginRejected, "login accepted, but phone \(phone.fingerprint) was revoked meanwhile: \(who); not unlocking \(logSafe(place(session)))", phone: phone.fingerprint, user: user, service: config.verifyService)
            finishLogin(on: id, LoginResult(.rejected, reason: "this phone was revoked at box \(identity.boxID)"), now: now)
            return nil
        }
        return session
    }

    /// logind unlocked `session` (`failure`: it did not).
    mutating func unlocked(_ session: LoginSession, failure: (any Error)?, _ push: CredentialPush, phone: PublicKey, on id: CentralID, now: Duration) {
        if let failure {
            log(.error, "logind did not unlock \(logSafe(place(session))): \(failure)")
            return finishLogin(on: id, LoginResult(.timedOut, reason: "the password was accepted, but logind did not unlock the session"), now: now)
        }
        audit(.info, .loginAccepted, "login accepted: \(unlocking(push, phone)) via \(logSafe(config.verifyService)); unlocked \(logSafe(place(session))) through logind", phone: phone.fingerprint, user: push.user, service: config.verifyService)
        credit(phone, user: push.user, name: push.deviceName, on: id, session: session, service: config.verifyService, now: now)
        finishLogin(on: id, LoginResult(.accepted, reason: String("\(place(session)) unlocked through logind".prefix(LoginResult.maxReasonLength))), now: now)
        readvertise()
    }

    private func unlocking(_ push: CredentialPush, _ phone: PublicKey) -> String {
        "phone \(phone.fingerprint) (\(logSafe(push.deviceName))) user \(logSafe(push.user))"
    }

    private func place(_ session: LoginSession) -> String { "session \(session.id) (\(session.place))" }

    private var notAtPrompt: LoginResult { LoginResult(.notAtPrompt, reason: "box \(identity.boxID) is not at a login prompt") }
}
