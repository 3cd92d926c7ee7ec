import BoxkeyCore
import BoxkeyRadio

/// Runs the work the box's decisions queue (`BoxWork`): the steps that wait on logind and on
/// PAM. Between waits it hands what it learned back to the box (`Box.update`), whose state
/// decides the next step, so nothing waits inside a decision and the `Box` actor never waits
/// on logind. `RadioService` runs each job as a child task of its own: a lock waiting on
/// logind holds up no other phone's.
struct BoxWorker: Sendable {
    let box: Box

    private var actions: SessionActions { box.actions }

    func run(_ job: BoxWork) async {
        switch job {
        case .act(let action, let id): await act(action, on: id)
        case .unlockThroughLogind(let push, let phone, let id): await unlockThroughLogind(push, phone: phone, on: id)
        case .walkAway(let away, let plan): await walkAway(away, plan)
        case .settle(let locked, let phone, let endable):
            let open = await actions.unconfirmedLocks(locked, phone: phone, await box.update { s, _ in s.sessionSettings })
            // `not_locked` as it is now, after the wait (a reload may have changed it).
            await actions.settle(open, phone: phone, endable: endable, await box.update { s, _ in s.sessionSettings }) { id in
                await box.closeSession(sessionID: id)
            }
        }
    }

    /// A phone's lock, logout or attach (`BoxState.actionPlan`, then `acted`).
    private func act(_ action: ActionResult.Action, on id: CentralID) async {
        let (planned, settings) = await box.update { s, _ in (s.actionPlan(action, on: id), s.sessionSettings) }
        guard let plan = planned else { return }
        var outcome = ActionResult.Outcome.noSession
        var attaching: String?
        switch plan {
        case .answer(let answer):
            outcome = answer
        case .lock(let targets, let users, let phone):
            outcome = await actions.lock(targets, orAllOf: users, phone: phone, reason: "phone asked", walkAway: false, settings).outcome
        case .logout(let targets, let phone):
            outcome = await actions.logout(targets, phone: phone, reason: "phone asked")
        case .attach(let users, _, let candidate):
            attaching = candidate
            // Each user as the loop reaches them: a walk-away lock may land meanwhile.
            for user in users where attaching == nil {
                guard await box.update({ s, _ in !s.lockedUsers.contains(user) }) else { continue }
                if await actions.hasUnlockedLocalSession(user) { attaching = user }
            }
        }
        await box.update { [outcome, attaching] s, now in s.acted(action, plan, outcome, attaching: attaching, on: id, now: now) }
    }

    /// A phone is gone: the policy's lock or logout, as decided when it went
    /// (`BoxState.queueWalkAway`).
    private func walkAway(_ away: BoxState.WalkAway, _ plan: BoxState.WalkAwayPlan) async {
        switch plan {
        case .lock(let bound):
            let settings = await box.update { s, _ in s.sessionSettings }
            let locked = await actions.lock(bound, orAllOf: [away.user], phone: away.phone, reason: away.reason, walkAway: true, settings)
            await box.update { s, _ in s.walkAwayLocked(away, locked) }
        case .logout(let bound):
            if await actions.logout(bound, phone: away.phone, reason: away.reason, "walk-away logout") == .done {
                await box.update { s, _ in for session in bound { s.registered.close(session.id) } }
            }
        }
    }

    /// A push with no prompt open (`[unlock] logind_unlock`): logind lists the user's sessions,
    /// the box's own PAM service checks the password, logind unlocks the one locked session.
    private func unlockThroughLogind(_ push: CredentialPush, phone: PublicKey, on id: CentralID) async {
        guard let uid = await box.update({ s, now in s.unlockUID(push, phone: phone, on: id, now: now) }) else { return }
        let listed: Result<[LoginSession], any Error>
        do { listed = .success(try await box.sessions.sessions(ofUID: uid)) } catch { listed = .failure(error) }
        guard let check = await box.update({ s, now in s.unlockTarget(listed, push, phone: phone, on: id, now: now) }) else { return }
        let answer = await check.run()
        guard let session = await box.update({ s, now in s.checked(check, answer, now: now) }) else { return }
        var failure: (any Error)?
        do { try await box.sessions.unlock(session: session.id) } catch { failure = error }
        await box.update { [failure] s, now in s.unlocked(session, failure: failure, push, phone: phone, on: id, now: now) }
    }
}
