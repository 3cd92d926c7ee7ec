import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio

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

    // MARK: - Lock, logout, attach, walk-away

    /// What a phone's lock, logout or attach acts on, decided before logind is asked
    /// (`BoxWorker` asks it, then hands the outcome to `acted`).
    enum ActionPlan: Sendable {
        /// Lock the targets; when unsure which session, all of the users' local ones.
        case lock([LoginSession], users: [String], phone: PublicKey)
        case logout([LoginSession], phone: PublicKey)
        /// Attach to the first user with an unlocked session; `candidate` is one on record.
        case attach(users: [String], phone: PublicKey, candidate: String?)
        /// Nothing for logind to do: the phone hears `outcome` now.
        case answer(ActionResult.Outcome)
    }

    /// A phone asked for a lock, logout or attach on link `id` (nil: the link is gone).
    mutating func actionPlan(_ action: ActionResult.Action, on id: CentralID) -> ActionPlan? {
        guard let phone = links[id]?.connection.phoneKey else { return nil }
        let users = enrolledUsers(of: phone)
        guard !users.isEmpty else {
            audit(.notice, .pushRefused, "refused \(action) from phone \(phone.fingerprint): not enrolled", phone: phone.fingerprint)
            return .answer(.noSession)
        }
        let bound = registered.sessions(boundTo: phone)
        let targets = bound.isEmpty ? users.flatMap { registered.sessions(of: $0) } : bound
        switch action {
        case .lock:
            return .lock(targets, users: users, phone: phone)
        case .logout:
            guard !targets.isEmpty else {
                audit(.notice, .pushRefused, "refused logout from phone \(phone.fingerprint): no session on record for \(users.map(logSafe).joined(separator: ", "))", phone: phone.fingerprint)
                return .answer(.noSession)
            }
            return .logout(targets, phone: phone)
        case .attach:
            // Attach only restores walk-away protection; it unlocks nothing. A session on
            // record, or (after a daemon restart forgot them) a local one logind lists.
            return .attach(users: users, phone: phone, candidate: users.first { !lockedUsers.contains($0) && !registered.sessions(of: $0).isEmpty })
        case .pair:
            return .answer(.noSession)
        }
    }

    /// logind did what `plan` asked (`outcome`), or found `attaching`'s unlocked session: the
    /// phone hears the result on link `id`.
    mutating func acted(_ action: ActionResult.Action, _ plan: ActionPlan, _ outcome: ActionResult.Outcome, attaching: String?,
                        on id: CentralID, now: Duration) {
        var outcome = outcome
        switch plan {
        case .lock(_, let users, let phone) where outcome == .done:
            // Presence ends only with what it guards: a lock that did not happen leaves the
            // session open, and walking away must still act on it.
            lockedUsers.formUnion(users)
            endPresence(of: phone, except: id)
        case .logout(let targets, let phone) where outcome == .done:
            for s in targets { registered.close(s.id) }
            endPresence(of: phone, except: id)
        case .attach(_, let phone, _):
            // As things are now, not as they were when logind was asked: the link may have
            // gone, the phone been revoked, or a walk-away have locked the user meanwhile.
            if let user = attaching, let link = links[id], !link.dropped, enrolledUsers(of: phone).contains(user), !lockedUsers.contains(user) {
                graces[phone] = nil
                presences[id] = startedPresence(phone: phone, user: user, now: now)
                audit(.info, .presence, "presence link back: phone \(phone.fingerprint) user \(logSafe(user))", phone: phone.fingerprint, user: user)
                outcome = .done
            } else {
                audit(.notice, .pushRefused, "refused attach from phone \(phone.fingerprint): no unlocked session on record", phone: phone.fingerprint)
            }
        default:
            break
        }
        // A lock or logout that did not happen on the presence link: the link goes on guarding.
        presences[id]?.actionEnded(now: now)
        guard var connection = links[id]?.connection else { return }
        let output = connection.finishAction(ActionResult(action: action, outcome: outcome))
        links[id]?.connection = connection
        perform(output, for: id, now: now)
        readvertise()
    }

    /// A revoked phone's live links end, but those of a presence link for one of `users` (the
    /// users it keeps). A presence link that ends so ends as a walk-away does (the policy's lock
    /// or logout, at once): nothing guards its session any more.
    mutating func endLinks(of phone: PublicKey, keeping users: [String] = [], reason: String, now: Duration) {
        // Its pushes held for a user it lost go first: the link that holds one has no presence,
        // and is kept below when the phone still serves someone else.
        dropHeldPushes(of: phone, keeping: users, reason: reason, now: now)
        var away: [String] = []
        for (id, link) in links where link.connection.phoneKey == phone {
            let user = presences[id]?.user
            guard users.isEmpty || user.map({ !users.contains($0) }) == true else { continue }
            if let user {
                away.append(user)
                audit(.notice, .sessionAction, "presence link of phone \(phone.fingerprint) user \(logSafe(user)) ended: \(reason)", phone: phone.fingerprint, user: user)
            }
            presences[id] = nil
            drop(id)
        }
        guard !away.isEmpty else { return }
        readvertise()
        for user in away { queueWalkAway(WalkAway(phone: phone, user: user, reason: reason)) }
    }

    /// A phone is gone: its walk-away (`BoxWorker`), on the sessions bound to it now and under
    /// the policy of now, not of when the job runs.
    mutating func queueWalkAway(_ away: WalkAway) {
        if let plan = walkAwayPlan(away) { emit(.work(.walkAway(away, plan))) }
    }

    /// The sessions a walk-away acts on, under `[presence] policy`: locked (`lock`) or ended.
    enum WalkAwayPlan: Sendable {
        case lock([LoginSession])
        case logout([LoginSession])
    }

    /// A phone is gone (`away`): what its walk-away does, or nil under `policy = none`.
    private func walkAwayPlan(_ away: WalkAway) -> WalkAwayPlan? {
        let bound = registered.sessions(boundTo: away.phone)
        switch config.policy {
        case .lock: return .lock(bound)
        // Unsure which session: lock them all rather than end one by guess.
        case .logout: return bound.isEmpty ? .lock([]) : .logout(bound)
        case .none: return nil
        }
    }

    /// A walk-away's lock ran: a user whose sessions locked must push again (not just attach),
    /// and the locks that need it are checked (`BoxWork.settle`).
    mutating func walkAwayLocked(_ away: WalkAway, _ locked: SessionActions.Locked) {
        if let (list, endable) = locked.toSettle { emit(.work(.settle(locked: list, phone: away.phone, endable: endable))) }
        if locked.outcome == .done { lockedUsers.insert(away.user) }
    }

    var sessionSettings: SessionActions.Settings {
        .init(lockConfirm: config.lockConfirm, notLocked: config.notLocked)
    }
}
