import BoxkeyCore
@testable import BoxkeyDaemon
import BoxkeyPhone
import BoxkeyRadio
import Testing

/// Walk-away on a session that nothing locks (a text console: logind's LockSession only signals
/// it, and LockedHint stays false): `[presence] not_locked` decides.
@Suite(.serialized, .timeLimit(.minutes(1))) struct WalkAwayTests {
    /// alice logs in with her phone into session `id` (of `type`; opened by the push, so bound to
    /// the phone by its ticket, unless `bound` is false), then the phone leaves.
    func walkAway(_ h: BoxHarness, session id: String, type: String, bound: Bool = true) async throws {
        let (identity, central) = try await h.phone(0x41, enrolledFor: "alice")
        let key = h.box.identity.keyPair.publicKey
        let prompt = try await h.prompt()
        let heard = try #require(try await findBox(BoxID(4821)!, pinned: key, radio: central, timeout: .seconds(5)))
        let link = try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: central)
        try await link.send(.credentialPush(CredentialPush(user: "alice", password: SecureBytes(utf8: "pw"), deviceName: "test")))
        guard case .awaitingEnter = try await link.next(timeout: .seconds(5)) else { Issue.record("not held"); return }
        guard case .push(_, _, let ticket) = await h.box.take(prompt, wait: .seconds(5)) else { Issue.record("no push"); return }
        await h.box.report(prompt, .accepted, reason: "")
        guard case .loginResult = try await link.next(timeout: .seconds(5)) else { Issue.record("no result"); return }
        h.sessions.add(LoginSession(id: id, uid: 1000, user: "alice", tty: type == "tty" ? "tty1" : "", type: type))
        await h.box.openSession(user: "alice", sessionID: id, service: "login", ticket: bound ? ticket : "")
        await link.close()
    }

    /// What logind was asked, once the walk-away's lock of session `id` has settled: the
    /// session said it is locked, or it was ended, or it was left open and the journal says so.
    /// (Up to `lock_confirm_s` after the lock: the box's own wait for LockedHint.)
    /// The line names the phone that walked away, as every line of a walk-away does.
    func settled(_ h: BoxHarness, session id: String) async throws -> [String] {
        let line = try await h.journal.line { line in
            line.message.hasPrefix("session \(id) (")
                && ["is locked, or gone", "it is still open", "ended it"].contains { line.message.contains($0) }
        }
        #expect(line.phone != nil, "\(line)")
        return h.sessions.calls.withLockedValue { $0 }
    }

    /// `boxkeyd phones revoke` of a phone whose presence link guards a session: the link ends
    /// as a walk-away does, and the session is locked (queued work now; the reply comes first).
    @Test func revokingAPhoneWithAPresenceLinkLocksTheSessionItGuarded() async throws {
        let h = try await BoxHarness()
        try await h.run {
            let link = try #require(try await h.honestLogin(0x35, keep: true))
            h.sessions.add(LoginSession(id: "9", uid: 1000, user: "alice", tty: "", display: ":0", type: "x11"))
            await h.box.openSession(user: "alice", sessionID: "9", service: "login", ticket: "")
            let phone = try #require(await h.box.presencePhones().first)
            guard case .text = await h.box.revoke(fingerprint: phone.fingerprint) else { Issue.record("not revoked"); return }
            try await h.journal.line(containing: "walk-away lock: session 9")
            #expect(h.sessions.calls.withLockedValue { $0 } == ["lock 9"])
            await link.close()
        }
    }

    @Test func aConsoleThatCannotLockIsEndedAfterTheConfirmTime() async throws {
        let h = try await BoxHarness { $0.lockConfirm = .seconds(1) }
        try await h.run {
            try await walkAway(h, session: "7", type: "tty")
            #expect(try await settled(h, session: "7") == ["lock 7", "terminate 7"])
        }
    }

    @Test func aConsoleThisPhoneDidNotOpenIsLockedAndNeverEnded() async throws {
        // A console alice logged into by typing: the phone's walk-away locks it (fail closed),
        // but does not end what the phone never opened.
        let h = try await BoxHarness { $0.lockConfirm = .seconds(1) }
        try await h.run {
            try await walkAway(h, session: "6", type: "tty", bound: false)
            #expect(try await settled(h, session: "6") == ["lock 6"])
        }
    }

    @Test func aDesktopWhoseLockerSaysSoStaysLocked() async throws {
        let h = try await BoxHarness { $0.lockConfirm = .seconds(1) }
        try await h.run {
            try await walkAway(h, session: "8", type: "x11")
            #expect(try await settled(h, session: "8") == ["lock 8"])
        }
    }

    @Test func keepLeavesTheConsoleOpenAndSaysSo() async throws {
        let h = try await BoxHarness { $0.lockConfirm = .seconds(1); $0.notLocked = .keep }
        try await h.run {
            try await walkAway(h, session: "9", type: "tty")
            #expect(try await settled(h, session: "9") == ["lock 9"])
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
