import BoxkeyCore
import BoxkeyRadio
import Logging

/// What the box asks of logind for a phone: lock and log out sessions, and check afterwards
/// what a lock did. It holds no box state: it is told which sessions and why, does the calls,
/// audits each, and says what happened; `BoxWorker` hands that to `BoxState`.
struct SessionActions: Sendable {
    let sessions: any SessionControl
    let clock: any RadioClock
    let audit: Logger
    let logger: Logger
    let userID: @Sendable (String) -> UInt32?

    /// `[presence] lock_confirm_s` and `not_locked`, as configured when the action starts.
    struct Settings: Sendable {
        var lockConfirm: Duration
        var notLocked: DaemonConfig.NotLocked
    }

    /// A lock's outcome; after a walk-away lock, the sessions to check later (`BoxWork.settle`)
    /// and which of them may be ended.
    struct Locked: Sendable {
        var outcome: ActionResult.Outcome
        var toSettle: (locked: [LoginSession], endable: Set<String>)?
    }

    /// Does `body` to each of `targets`: done if it worked for one.
    func run(_ what: String, _ targets: [LoginSession], phone: PublicKey, reason: String,
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

    func logout(_ targets: [LoginSession], phone: PublicKey, reason: String, _ what: String = "logout") async -> ActionResult.Outcome {
        await run(what, targets, phone: phone, reason: reason) { try await sessions.terminate(session: $0) }
    }

    /// Locks `targets`; with none on record, every local session of `users` that logind
    /// lists — walk-away fails closed. A session that does not then say it is locked
    /// (LockedHint) within `lock_confirm_s` has nothing on it that follows logind's Lock: after a
    /// walk-away one of `targets` (sessions this phone opened or unlocked) is ended
    /// (`[presence] not_locked = logout`, the default) or kept and logged (`keep`); one found only
    /// by the fail-closed search is never ended, only logged. An explicit lock never ends a
    /// session: one that left any session open tells the phone `notLockable`.
    func lock(_ targets: [LoginSession], orAllOf users: [String], phone: PublicKey, reason: String, walkAway: Bool,
              _ settings: Settings) async -> Locked {
        var list = targets
        let endable = walkAway ? Set(targets.map(\.id)) : []
        if list.isEmpty {
            for user in users {
                guard let uid = userID(user) else { continue }
                do { list += try await sessions.sessions(ofUID: uid).filter(\.isLocal) } catch {
                    audit.audit(.error, .sessionAction, "cannot list the sessions of \(logSafe(user)) to lock them: \(error)")
                }
            }
            audit.audit(.notice, .sessionAction, "no session on record for \(users.map(logSafe).joined(separator: ", ")): locking all \(list.count) local session(s)", phone: phone.fingerprint)
        }
        guard !list.isEmpty else { return Locked(outcome: .noSession) }
        let outcome = await run(walkAway ? "walk-away lock" : "lock", list, phone: phone, reason: reason) { try await sessions.lock(session: $0) }
        guard outcome == .done else { return Locked(outcome: outcome) }
        // After a walk-away nobody waits for the answer: the timers carry on while the
        // sessions are checked.
        if walkAway { return Locked(outcome: outcome, toSettle: (list, endable)) }
        let open = await unconfirmedLocks(list, phone: phone, settings)
        await settle(open, phone: phone, endable: [], settings)
        // One session that stayed open is enough: the phone must not hear "locked", and its
        // presence link must go on guarding what is open (a console beside a locked desktop).
        return Locked(outcome: open.isEmpty ? outcome : .notLockable)
    }

    /// logind's LockSession only signals the session: the sessions of `list` that logind says
    /// are still not locked (`LockedHint` false) `lock_confirm_s` later. A session logind did not
    /// answer for at the end is not among them: an outage is not proof that nothing locked it.
    func unconfirmedLocks(_ list: [LoginSession], phone: PublicKey, _ settings: Settings) async -> [LoginSession] {
        let deadline = clock.now + settings.lockConfirm
        var open = list
        var unanswered: [String] = []
        while true {
            var still: [LoginSession] = []
            unanswered = []
            for s in open {
                switch await lockedHint(s.id) {
                case true?:
                    audit.audit(.info, .sessionAction, "session \(logSafe(s.id)) (\(logSafe(s.user)), \(logSafe(s.place))) is locked, or gone (logind's LockedHint)", phone: phone.fingerprint, user: s.user)
                case false?: still.append(s)
                case nil: still.append(s); unanswered.append(s.id)
                }
            }
            open = still
            guard !open.isEmpty, clock.now < deadline else { break }
            try? await clock.sleep(for: .milliseconds(100))
        }
        if !unanswered.isEmpty {
            audit.audit(.warning, .sessionAction, "logind did not answer whether session(s) \(unanswered.map(logSafe).joined(separator: ", ")) locked: not acting on them", phone: phone.fingerprint)
        }
        return open.filter { !unanswered.contains($0.id) }
    }

    /// logind's LockedHint of a session; nil when logind did not answer. A session that is gone
    /// needs nothing more.
    private func lockedHint(_ id: String) async -> Bool? {
        do { return try await sessions.session(id: id)?.locked ?? true } catch { return nil }
    }

    /// Sessions a lock did not lock: those in `endable` (after a walk-away, the sessions this
    /// phone opened) are ended unless `not_locked = keep`; every one is said loudly. `ended`
    /// hears of each session ended, at once.
    func settle(_ open: [LoginSession], phone: PublicKey, endable: Set<String>, _ settings: Settings,
                ended: @Sendable (String) async -> Void = { _ in }) async {
        let seconds = settings.lockConfirm.components.seconds
        for s in open {
            let what = "session \(logSafe(s.id)) (\(logSafe(s.user)), \(logSafe(s.place))) cannot be locked: nothing on it follows logind's Lock (LockedHint still false \(seconds) s after LockSession) — a text console, or a desktop without a logind-aware locker"
            guard endable.contains(s.id), settings.notLocked == .logout else {
                let why = endable.contains(s.id) ? " ([presence] not_locked = keep)" : endable.isEmpty ? "" : " (not a session this phone opened: never ended for it)"
                audit.audit(.error, .sessionAction, "\(what); it is still open\(why)", phone: phone.fingerprint, user: s.user)
                continue
            }
            do {
                try await sessions.terminate(session: s.id)
                await ended(s.id)
                audit.audit(.notice, .sessionAction, "\(what): ended it ([presence] not_locked = logout)", phone: phone.fingerprint, user: s.user)
            } catch {
                audit.audit(.error, .sessionAction, "\(what), and ending it failed: \(error); it may still be open", phone: phone.fingerprint, user: s.user)
            }
        }
    }

    /// Whether logind lists a local session of `user` that is not locked (an attach after a
    /// daemon restart forgot the sessions on record).
    func hasUnlockedLocalSession(_ user: String) async -> Bool {
        guard let uid = userID(user), let live = try? await sessions.sessions(ofUID: uid) else { return false }
        return live.contains { $0.isLocal && !$0.locked }
    }
}
