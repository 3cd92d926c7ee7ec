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
        case .settle(let locked, let phone, let endable): await settle(await unconfirmedLocks(locked), phone: phone, endable: endable)
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
                outcome = await lock(targets, orAllOf: users, phone: phone, reason: "phone asked", walkAway: false)
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
                    outcome = await run("logout", targets, phone: phone, reason: "phone asked") { try await self.sessions.terminate(session: $0) }
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
                    for user in users where !state.lockedUsers.contains(user) {
                        guard let uid = uid(of: user), let live = try? await sessions.sessions(ofUID: uid),
                              live.contains(where: { $0.isLocal && !$0.locked }) else { continue }
                        candidate = user
                        break
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


    private func run(_ what: String, _ targets: [LoginSession], phone: PublicKey, reason: String,
                     _ body: @Sendable (String) async throws -> Void) async -> ActionResult.Outcome {
        var done = 0
        for s in targets {
            do {
                try await body(s.id)
                audit.audit(.notice, .sessionAction, "\(what): session \(logSafe(s.id)) (\(logSafe(s.place))) user \(logSafe(s.user)) phone \(phone.fingerprint) (\(reason))", phone: phone.fingerprint, user: s.user)
                done += 1
            } catch {
                logger.error("\(what) of session \(logSafe(s.id)) failed: \(error)")
            }
        }
        return done > 0 ? .done : .failed
    }

    /// Locks `targets`; with none on record, every local session of `users` that logind
    /// lists — walk-away fails closed. A session that does not then say it is locked
    /// (LockedHint) within `lock_confirm_s` has nothing on it that follows logind's Lock: after a
    /// walk-away one of `targets` (sessions this phone opened or unlocked) is ended
    /// (`[presence] not_locked = logout`, the default) or kept and logged (`keep`); one found only
    /// by the fail-closed search is never ended, only logged. An explicit lock that locked
    /// nothing reports a failure to the phone.
    private func lock(_ targets: [LoginSession], orAllOf users: [String], phone: PublicKey, reason: String, walkAway: Bool) async -> ActionResult.Outcome {
        var list = targets
        let endable = walkAway ? Set(targets.map(\.id)) : []
        if list.isEmpty {
            for user in users {
                guard let uid = uid(of: user) else { continue }
                do { list += try await sessions.sessions(ofUID: uid).filter(\.isLocal) } catch {
                    audit.audit(.error, .sessionAction, "cannot list the sessions of \(logSafe(user)) to lock them: \(error)")
                }
            }
            audit.audit(.notice, .sessionAction, "no session on record for \(users.map(logSafe).joined(separator: ", ")): locking all \(list.count) local session(s)", phone: phone.fingerprint)
        }
        guard !list.isEmpty else { return .noSession }
        let outcome = await run(walkAway ? "walk-away lock" : "lock", list, phone: phone, reason: reason) { try await self.sessions.lock(session: $0) }
        guard outcome == .done else { return outcome }
        if walkAway {
            // Nobody waits for the answer: the timers carry on while the sessions are checked.
            workContinuation.yield(.settle(locked: list, phone: phone, endable: endable))
            return outcome
        }
        let open = await unconfirmedLocks(list)
        await settle(open, phone: phone, endable: [])
        return open.count == list.count ? .failed : outcome
    }

    /// logind's LockSession only signals the session: the sessions of `list` that logind says
    /// are still not locked (`LockedHint` false) `lock_confirm_s` later. A session logind did not
    /// answer for at the end is not among them: an outage is not proof that nothing locked it.
    private func unconfirmedLocks(_ list: [LoginSession]) async -> [LoginSession] {
        let deadline = clock.now + state.config.lockConfirm
        var open = list
        var unanswered: [String] = []
        while true {
            var still: [LoginSession] = []
            unanswered = []
            for s in open {
                switch await lockedHint(s.id) {
                case true?: break
                case false?: still.append(s)
                case nil: still.append(s); unanswered.append(s.id)
                }
            }
            open = still
            guard !open.isEmpty, clock.now < deadline else { break }
            try? await clock.sleep(for: .milliseconds(100))
        }
        if !unanswered.isEmpty {
            audit.audit(.warning, .sessionAction, "logind did not answer whether session(s) \(unanswered.map(logSafe).joined(separator: ", ")) locked: not acting on them")
        }
        return open.filter { !unanswered.contains($0.id) }
    }

    /// logind's LockedHint of a session; nil when logind did not answer. A session that is gone
    /// needs nothing more.
    private func lockedHint(_ id: String) async -> Bool? {
        do { return try await sessions.session(id: id)?.locked ?? true } catch { return nil }
    }

    /// Sessions a lock did not lock: those in `endable` (after a walk-away, the sessions this
    /// phone opened) are ended unless `not_locked = keep`; every one is said loudly.
    private func settle(_ open: [LoginSession], phone: PublicKey, endable: Set<String>) async {
        let seconds = state.config.lockConfirm.components.seconds
        for s in open {
            let what = "session \(logSafe(s.id)) (\(logSafe(s.user)), \(logSafe(s.place))) did not report itself locked \(seconds) s after LockSession (LockedHint false): nothing on it follows logind's Lock — a text console, or a desktop without a logind-aware locker"
            guard endable.contains(s.id), state.config.notLocked == .logout else {
                let why = endable.contains(s.id) ? " ([presence] not_locked = keep)" : endable.isEmpty ? "" : " (not a session this phone opened: never ended for it)"
                audit.audit(.error, .sessionAction, "\(what); it is still open\(why)", phone: phone.fingerprint, user: s.user)
                continue
            }
            do {
                try await sessions.terminate(session: s.id)
                state.registered.close(s.id)
                audit.audit(.notice, .sessionAction, "\(what): ended it ([presence] not_locked = logout)", phone: phone.fingerprint, user: s.user)
            } catch {
                audit.audit(.error, .sessionAction, "\(what), and ending it failed: \(error); it may still be open", phone: phone.fingerprint, user: s.user)
            }
        }
    }

    func walkAway(_ away: BoxState.WalkAway) async { await walkAway(phone: away.phone, user: away.user, reason: away.reason) }

    private func walkAway(phone: PublicKey, user: String, reason: String) async {
        let bound = state.registered.sessions(boundTo: phone)
        switch state.config.policy {
        case .lock:
            if await lock(bound, orAllOf: [user], phone: phone, reason: reason, walkAway: true) == .done { state.lockedUsers.insert(user) }
        case .logout:
            if bound.isEmpty {
                // Unsure which session: lock them all rather than end one by guess.
                if await lock([], orAllOf: [user], phone: phone, reason: reason, walkAway: true) == .done { state.lockedUsers.insert(user) }
            } else if await run("walk-away logout", bound, phone: phone, reason: reason, { try await self.sessions.terminate(session: $0) }) == .done {
                for s in bound { state.registered.close(s.id) }
            }
        case .none:
            break
        }
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
        for user in away { await walkAway(phone: phone, user: user, reason: reason) }
    }
}
