import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio
import Logging

/// Lock, logout, attach and walk-away: each waits on logind, so they run here, around the
/// state's decisions.
extension Box {
    // MARK: - Lock, logout, attach, walk-away

    /// Runs one job a decision queued (`BoxWork`).
    func run(_ job: BoxWork) async {
        switch job {
        case .act(let action, let id): await act(action, for: id)
        case .unlockThroughLogind(let push, let phone, let id): await unlockThroughLogind(push, phone: phone, on: id)
        case .settle(let locked, let phone, let endable):
            let open = await actions.unconfirmedLocks(locked, sessionSettings)
            // `not_locked` as it is now, after the wait (a reload may have changed it).
            await actions.settle(open, phone: phone, endable: endable, sessionSettings) { await self.closeSession(sessionID: $0) }
        }
    }

    private func act(_ action: ActionResult.Action, for id: CentralID) async {
        guard let phone = state.links[id]?.connection.phoneKey else { return }
        let users = state.enrolledUsers(of: phone)
        var outcome: ActionResult.Outcome = .noSession
        if users.isEmpty {
            audit.audit(.notice, .pushRefused, "refused \(action) from phone \(phone.fingerprint): not enrolled", phone: phone.fingerprint)
        } else {
            let bound = state.registered.sessions(boundTo: phone)
            let known = users.flatMap { state.registered.sessions(of: $0) }
            let targets = bound.isEmpty ? known : bound
            switch action {
            case .lock:
                // Lock is harmless: when unsure which session, lock all of the users' local ones.
                outcome = await actions.lock(targets, orAllOf: users, phone: phone, reason: "phone asked", walkAway: false, sessionSettings).outcome
                // Presence ends only with what it guards: a lock that did not happen leaves the
                // session open, and walking away must still act on it.
                if outcome == .done {
                    state.lockedUsers.formUnion(users)
                    state.endPresence(of: phone, except: id)
                }
            case .logout:
                if targets.isEmpty {
                    audit.audit(.notice, .pushRefused, "refused logout from phone \(phone.fingerprint): no session on record for \(users.map(logSafe).joined(separator: ", "))", phone: phone.fingerprint)
                } else {
                    outcome = await actions.logout(targets, phone: phone, reason: "phone asked")
                    if outcome == .done {
                        for s in targets { state.registered.close(s.id) }
                        state.endPresence(of: phone, except: id)
                    }
                }
            case .attach:
                // Attach only restores walk-away protection; it unlocks nothing. A session on
                // record, or (after a daemon restart forgot them) a local one logind lists.
                var candidate = users.first { !state.lockedUsers.contains($0) && !state.registered.sessions(of: $0).isEmpty }
                if candidate == nil {
                    // Each user as the loop reaches them: a walk-away lock may land meanwhile.
                    for user in users where !state.lockedUsers.contains(user) {
                        if await actions.hasUnlockedLocalSession(user) { candidate = user; break }
                    }
                }
                if let user = candidate {
                    state.graces[phone] = nil
                    state.presences[id] = state.startedPresence(phone: phone, user: user, now: clock.now)
                    audit.audit(.info, .presence, "presence link back: phone \(phone.fingerprint) user \(logSafe(user))", phone: phone.fingerprint, user: user)
                    outcome = .done
                } else {
                    audit.audit(.notice, .pushRefused, "refused attach from phone \(phone.fingerprint): no unlocked session on record", phone: phone.fingerprint)
                }
            case .pair:
                break
            }
        }
        guard var connection = state.links[id]?.connection else { return }
        let output = connection.finishAction(ActionResult(action: action, outcome: outcome))
        state.links[id]?.connection = connection
        state.perform(output, for: id, now: clock.now)
        state.readvertise()
    }

    /// The policy's lock or logout for a phone that is gone.
    func walkAway(_ away: BoxState.WalkAway) async {
        let (phone, user, reason) = (away.phone, away.user, away.reason)
        let bound = state.registered.sessions(boundTo: phone)
        switch state.config.policy {
        case .lock:
            await walkAwayLock(bound, user: user, phone: phone, reason: reason)
        case .logout:
            if bound.isEmpty {
                // Unsure which session: lock them all rather than end one by guess.
                await walkAwayLock([], user: user, phone: phone, reason: reason)
            } else if await actions.logout(bound, phone: phone, reason: reason, "walk-away logout") == .done {
                for s in bound { state.registered.close(s.id) }
            }
        case .none:
            break
        }
    }

    private func walkAwayLock(_ bound: [LoginSession], user: String, phone: PublicKey, reason: String) async {
        let locked = await actions.lock(bound, orAllOf: [user], phone: phone, reason: reason, walkAway: true, sessionSettings)
        if let (list, endable) = locked.toSettle { state.emit(.work(.settle(locked: list, phone: phone, endable: endable))) }
        if locked.outcome == .done { state.lockedUsers.insert(user) }
    }

    var sessionSettings: SessionActions.Settings {
        .init(lockConfirm: state.config.lockConfirm, notLocked: state.config.notLocked)
    }

    /// A revoked phone's live links end, but those of a presence link for one of `users` (the
    /// users it keeps). A presence link that ends so ends as a walk-away does (the policy's lock
    /// or logout, at once): nothing guards its session any more.
    func endLinks(of phone: PublicKey, keeping users: [String] = [], reason: String) async {
        var away: [String] = []
        for (id, link) in state.links where link.connection.phoneKey == phone {
            let user = state.presences[id]?.user
            guard users.isEmpty || user.map({ !users.contains($0) }) == true else { continue }
            if let user {
                away.append(user)
                audit.audit(.notice, .sessionAction, "presence link of phone \(phone.fingerprint) user \(logSafe(user)) ended: \(reason)", phone: phone.fingerprint, user: user)
            }
            state.presences[id] = nil
            state.drop(id)
        }
        guard !away.isEmpty else { return }
        state.readvertise()
        for user in away { await walkAway(BoxState.WalkAway(phone: phone, user: user, reason: reason)) }
    }
}
