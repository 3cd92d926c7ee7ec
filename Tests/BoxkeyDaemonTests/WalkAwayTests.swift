import BoxkeyCore
@testable import BoxkeyDaemon
import BoxkeyRadio
import Testing

/// Walk-away on a session that nothing locks (a text console: logind's LockSession only signals
/// it, and LockedHint stays false): `[presence] not_locked` decides.
@Suite(.serialized) struct WalkAwayTests {
    /// alice logs in with a phone into session `id` (of `type`), then the phone leaves.
    func walkAway(_ h: BoxHarness, session id: String, type: String) async throws {
        let link = try #require(try await h.honestLogin(0x41, keep: true))
        h.sessions.add(LoginSession(id: id, uid: 1000, user: "alice", tty: type == "tty" ? "tty1" : "", type: type))
        await h.box.openSession(user: "alice", sessionID: id, service: "login", ticket: "")
        await link.close()
    }

    func calls(_ h: BoxHarness, settleAfter: Duration) async throws -> [String] {
        let clock = MonotonicClock(), start = clock.now
        var seen: [String] = []
        while clock.now - start < settleAfter {
            seen = h.sessions.calls.withLockedValue { $0 }
            try await Task.sleep(for: .milliseconds(100))
        }
        return seen
    }

    @Test func aConsoleThatCannotLockIsEndedAfterTheConfirmTime() async throws {
        let h = try BoxHarness { $0.lockConfirm = .seconds(1) }
        try await h.run {
            try await walkAway(h, session: "7", type: "tty")
            #expect(try await calls(h, settleAfter: .seconds(3)) == ["lock 7", "terminate 7"])
        }
    }

    @Test func aDesktopWhoseLockerSaysSoStaysLocked() async throws {
        let h = try BoxHarness { $0.lockConfirm = .seconds(1) }
        try await h.run {
            try await walkAway(h, session: "8", type: "x11")
            #expect(try await calls(h, settleAfter: .seconds(3)) == ["lock 8"])
        }
    }

    @Test func keepLeavesTheConsoleOpenAndSaysSo() async throws {
        let h = try BoxHarness { $0.lockConfirm = .seconds(1); $0.notLocked = .keep }
        try await h.run {
            try await walkAway(h, session: "9", type: "tty")
            #expect(try await calls(h, settleAfter: .seconds(3)) == ["lock 9"])
        }
    }

    @Test func theSettingsParse() throws {
        let c = try DaemonConfig.parse("[presence]\nnot_locked = \"keep\"\nlock_confirm_s = 10\n", source: "t")
        #expect(c.notLocked == .keep && c.lockConfirm == .seconds(10))
        #expect(throws: DaemonConfig.Error.self) { try DaemonConfig.parse("[presence]\nnot_locked = \"lock\"\n", source: "t") }
        #expect(throws: DaemonConfig.Error.self) { try DaemonConfig.parse("[presence]\nlock_confirm_s = 0\n", source: "t") }
        #expect(DaemonConfig().notLocked == .logout && DaemonConfig().lockConfirm == .seconds(5))
    }
}
