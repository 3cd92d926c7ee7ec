@testable import BoxkeyDaemon
import Logging
import Testing

/// The journal fields boxkeyd sends (the package test in the booted container reads them back
/// with `journalctl -o export`), and what a SIGHUP may change.
@Suite struct DaemonLogTests {
    @Test func auditEventsCarryPriorityMessageIDAndFields() {
        let fields = DaemonLogHandler.journalFields(
            level: .notice, message: "login rejected: phone 7F3A user alice",
            metadata: ["message_id": "f33562577614429a8bcbe4f574ff1c78", "boxkey_user": "alice", "boxkey_phone": "7F3A",
                       "boxkey_service": "gdm-password", "audit": "true", "_SYSTEMD_UNIT": "forged", "9lives": "x"],
            file: "BoxkeyDaemon/Box.swift", function: "report", line: 42)
        #expect(fields.contains("MESSAGE=login rejected: phone 7F3A user alice"))
        #expect(fields.contains("PRIORITY=5"))
        #expect(fields.contains("SYSLOG_IDENTIFIER=boxkeyd"))
        #expect(fields.contains("MESSAGE_ID=f33562577614429a8bcbe4f574ff1c78"))
        #expect(fields.contains("BOXKEY_USER=alice") && fields.contains("BOXKEY_PHONE=7F3A") && fields.contains("BOXKEY_SERVICE=gdm-password"))
        #expect(fields.contains("CODE_LINE=42"))
        // Trusted fields (leading _) are journald's to set; names must not start with a digit.
        #expect(!fields.contains { $0.hasPrefix("_") || $0.hasPrefix("9") })
    }

    @Test func textFieldsCannotForgeFields() {
        #expect(DaemonLogHandler.quoted("alice") == "alice")
        #expect(DaemonLogHandler.quoted("x boxkey_user=root") == "\"x boxkey_user=root\"")
        #expect(DaemonLogHandler.quoted("a\"] b") == "\"a\\\"] b\"")
    }

    @Test func prioritiesAreSyslogs() {
        #expect([Logger.Level.debug, .info, .notice, .warning, .error, .critical].map(DaemonLogHandler.priority) == [7, 6, 5, 4, 3, 2])
    }

    @Test func everyEventHasItsOwnMessageID() {
        let ids = AuditEvent.allCases.map(\.messageID)
        #expect(Set(ids).count == ids.count)
        #expect(ids.allSatisfy { $0.count == 32 && $0.allSatisfy(\.isHexDigit) })
    }

    @Test func journalIsUsedOnlyWhenStandardErrorIsTheJournalsStream() {
        #expect(!DaemonLogHandler.standardErrorIsJournal(environment: [:]))
        #expect(!DaemonLogHandler.standardErrorIsJournal(environment: ["JOURNAL_STREAM": "8:12345"]))
    }

    @Test func reloadKeepsWhatNeedsARestartAndSaysSo() throws {
        let running = try DaemonConfig.parse("[box]\nid = \"4821\"\n[pam]\nsocket = \"/run/a.sock\"\n")
        let file = try DaemonConfig.parse("""
            [box]
            id = "4822"
            [pam]
            socket = "/run/b.sock"
            services = ["login"]
            [limits]
            rejected_pushes_per_user = 3
            """)
        let (next, needRestart) = running.reloading(file)
        #expect(needRestart == ["[box] id", "[pam] socket"])
        #expect(next.boxID?.description == "4821" && next.pamSocket == "/run/a.sock")
        #expect(next.phoneLoginServices == ["login"] && next.rejectedPushesPerUser == 3)
        #expect(running.reloading(running).needRestart.isEmpty)
    }
}
