import BoxkeyCore
import BoxkeyPAMWire

/// What the box decides once PAM or logind has answered: an escrow capture sealed or refused,
/// a session the PAM stack opened registered or refused.
extension BoxState {
    /// The module's copy of the password typed at an escrow capture prompt (before its report).
    mutating func captured(_ id: UInt64, password: SecureBytes) {
        guard case .capture? = prompts[id]?.verifying?.escrow else { return }
        prompts[id]!.verifying!.captured = password
    }

    /// An escrow capture ended: the person typed the password with the phone present. Sealed
    /// only when the stack accepted the login and the box's own service (`check`, nil when it
    /// did not run) confirms the typed password is the user's; then the phone gets the login's
    /// credit.
    mutating func sealCapture(_ prompt: PromptTable.Prompt, _ v: PromptTable.Verifying, secret: SecureBytes,
                              verdict: PAMRequest.Verdict, check: PAMVerifier.Verdict?, who: String, now: Duration) {
        let service = prompt.request.service
        func refuse(_ why: String, _ reason: String) {
            // A failed capture counts like a rejected push: an enrolled phone cannot take over
            // prompts with "type the password" without limit.
            recordRejection(v.phone, user: v.user, now: now)
            _ = registered.redeem(v.ticket, user: v.user, now: now)
            audit(.notice, .loginRejected, "not sealing: \(who): \(why)", phone: v.phone.fingerprint, user: v.user, service: service)
            finishLogin(on: v.link, LoginResult(.rejected, reason: reason), now: now)
        }
        guard verdict != .rejected else { return refuse("the login was not accepted", "the login at the box was not accepted; nothing was sealed") }
        guard let password = v.captured, let check else {
            return refuse("the stack accepted the login without a typed password", "the box logged in without a typed password; nothing was sealed")
        }
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
            log(.error, "cannot keep the sealed password: \(error)")
            return refuse("cannot write the sealed copy (\(error))", "the box could not store the sealed password")
        }
        audit(.notice, .loginAccepted, "login accepted: \(who); the typed password is sealed for this phone (escrow)", phone: v.phone.fingerprint, user: v.user, service: service)
        let own = prompt.owner.flatMap { $0.sessionClass != "greeter" && $0.user == v.user ? $0 : nil }
        credit(v.phone, user: v.user, name: v.name, on: v.link, session: own, service: service, now: now)
        finishLogin(on: v.link, LoginResult(.accepted, reason: String("\(prompt.description); password sealed for this phone".prefix(LoginResult.maxReasonLength))), now: now)
        readvertise()
    }

    /// `pam_sm_open_session`: registers the session only if logind says (`session`) it is a
    /// local session of that user's uid; the ticket binds it to the phone whose push opened it.
    mutating func sessionOpened(_ session: Result<LoginSession?, any Error>, uid: UInt32?, user: String, sessionID: String,
                                service: String, ticket: String, now: Duration) {
        let what = "session \(logSafe(sessionID)) for \(logSafe(user)) by \(logSafe(service))"
        guard let uid else {
            audit(.notice, .sessionRefused, "refused to register \(what): no such user", user: user, service: service)
            return
        }
        let found: LoginSession?
        switch session {
        case .success(let s): found = s
        case .failure(let error):
            audit(.warning, .sessionRefused, "refused to register \(what): logind did not answer (\(error))", user: user, service: service)
            return
        }
        guard let session = found else { audit(.notice, .sessionRefused, "refused to register \(what): logind does not know it", user: user, service: service); return }
        guard session.uid == uid else {
            audit(.warning, .sessionRefused, "refused to register \(what): logind says it belongs to uid \(session.uid), not \(uid)", user: user, service: service)
            return
        }
        guard session.isLocal else {
            log(.info, "not registering \(what): not a local session")
            return
        }
        let phone = registered.redeem(ticket, user: user, now: now)
        registered.register(session, service: service, phone: phone)
        audit(.info, .sessionRegistered, "session \(logSafe(sessionID)) (\(logSafe(user)), \(logSafe(session.place))) registered by \(logSafe(service))\(phone.map { " for phone \($0.fingerprint)" } ?? "")",
              phone: phone?.fingerprint, user: user, service: service)
    }
}
