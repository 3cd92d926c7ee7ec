import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio
import Logging

/// What the PAM module reports: a verdict, which may wait on the box's own password check, and
/// the session the stack opened, which waits on logind. The decisions before and after each
/// wait are `BoxState`'s (`BoxState+Verdicts`, `BoxState+Sessions`).
extension Box {
    /// The PAM stack's verdict on a push (`BoxState.report`), and the box's own check of a
    /// password where the verdict needs one.
    public func report(_ id: UInt64, _ verdict: PAMRequest.Verdict, reason: String) async {
        guard let check = state.report(id, verdict, reason: reason, now: clock.now) else { return }
        let answer = await check.run()
        _ = state.checked(check, answer, now: clock.now)
    }

    /// The module's copy of the password typed at an escrow capture prompt (before its report).
    public func captured(_ id: UInt64, password: SecureBytes) { state.captured(id, password: password) }

    /// `pam_sm_open_session`: logind's record of the session, for the state to register
    /// (`BoxState.sessionOpened`).
    public func openSession(user: String, sessionID: String, service: String, ticket: String) async {
        let uid = state.uid(of: user)
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
