import BoxkeyCore
@testable import BoxkeyDaemon
import BoxkeySimRadio
import Logging
import NIOConcurrencyHelpers
import Testing

/// `SessionActions` against a recorded logind: no box, no radio, no sleep (a lock's
/// confirmation time is zero or the session says at once that it locked).
struct SessionActionsTests {
    let sessions = RecordedSessions()
    let phone = KeyPair.generate().publicKey
    var actions: SessionActions {
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        return SessionActions(sessions: sessions, clock: ManualClock(), audit: logger, logger: logger, userID: testUsers)
    }
    static let now = SessionActions.Settings(lockConfirm: .zero, notLocked: .logout)

    @Test func withNoSessionOnRecordALockTakesEveryLocalSessionOfTheUser() async throws {
        sessions.add(LoginSession(id: "1", uid: 1000, user: "alice", tty: "", type: "x11"))
        sessions.add(LoginSession(id: "2", uid: 1000, user: "alice", tty: "", type: "wayland"))
        sessions.add(LoginSession(id: "3", uid: 1002, user: "bob", tty: "", type: "x11"))
        let locked = await actions.lock([], orAllOf: ["alice"], phone: phone, reason: "test", walkAway: false, Self.now)
        #expect(locked.outcome == .done)
        #expect(locked.toSettle == nil)
        #expect(sessions.calls.withLockedValue { $0 } == ["lock 1", "lock 2"])
    }

    @Test func anExplicitLockThatLockedNothingSaysSoAndEndsNothing() async throws {
        // A text console follows no Lock: LockedHint stays false.
        sessions.add(LoginSession(id: "7", uid: 1000, user: "alice", tty: "tty2", type: "tty"))
        let session = try await sessions.session(id: "7")!
        let locked = await actions.lock([session], orAllOf: ["alice"], phone: phone, reason: "test", walkAway: false, Self.now)
        #expect(locked.outcome == .notLockable)
        #expect(sessions.calls.withLockedValue { $0 } == ["lock 7"])
    }

    @Test func afterAWalkAwayOnlyTheSessionsThePhoneOpenedAreEnded() async throws {
        sessions.add(LoginSession(id: "7", uid: 1000, user: "alice", tty: "tty2", type: "tty"))
        sessions.add(LoginSession(id: "8", uid: 1000, user: "alice", tty: "tty3", type: "tty"))
        let opened = try await sessions.session(id: "7")!
        let locked = await actions.lock([opened], orAllOf: ["alice"], phone: phone, reason: "walked away", walkAway: true, Self.now)
        #expect(locked.outcome == .done)
        let (list, endable) = try #require(locked.toSettle)
        #expect(endable == ["7"])
        let open = await actions.unconfirmedLocks(list + [try await sessions.session(id: "8")!], phone: phone, Self.now)
        #expect(open.map(\.id) == ["7", "8"])
        let ended = NIOLockedValueBox<[String]>([])
        await actions.settle(open, phone: phone, endable: endable, Self.now) { id in ended.withLockedValue { $0.append(id) } }
        #expect(ended.withLockedValue { $0 } == ["7"])
        #expect(sessions.calls.withLockedValue { $0 } == ["lock 7", "terminate 7"])
        // `not_locked = keep`: nothing is ended.
        let keep = SessionActions.Settings(lockConfirm: .zero, notLocked: .keep)
        await actions.settle(open, phone: phone, endable: endable, keep) { Issue.record("ended \($0) under keep") }
    }

    @Test func attachFindsAnUnlockedLocalSessionOnly() async throws {
        sessions.add(LoginSession(id: "1", uid: 1000, user: "alice", tty: "", type: "x11"))
        try await sessions.lock(session: "1")
        #expect(await actions.hasUnlockedLocalSession("alice") == false)
        sessions.add(LoginSession(id: "2", uid: 1002, user: "bob", tty: "", type: "x11"))
        #expect(await actions.hasUnlockedLocalSession("bob"))
    }
}
