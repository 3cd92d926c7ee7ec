@testable import BoxkeyDaemon
import Testing

@Suite struct DaemonConfigTests {
    @Test func everyKeyParsesWithItsDefault() throws {
        let c = try DaemonConfig.parse("""
            [box]
            id = "4821"   # a comment
            [presence]
            policy = "logout"
            grace_s = 2.5
            rssi_lock_dbm = -85
            [pam]
            allowed_uids = [1000, 1001]
            """)
        #expect(c.boxID?.description == "4821")
        #expect(c.policy == .logout && c.grace == .milliseconds(2500) && c.rssiLockThreshold == -85)
        #expect(c.pamAllowedUIDs == [1000, 1001])
        #expect(c.maxConnections == 4)   // untouched keys keep their defaults
    }

    /// Inputs that made TOMLKit's toml++ abort the process (Fuzz/regressions/) and their kin:
    /// each is an error naming the line, never a crash.
    @Test(arguments: ["[)x]", "[box]\nid = \"48\\n21\"", "[box\nid = 1", "id = [1, \"a\"]", "= 3", "[box]\nid = 'x'", "[Box]", "key = tru", "k = 1.2.3",
                     "#[b\r\n[@b\r\n", "#[b\r\n[#+", "# a\r[)x]", "[box]\u{7}",
                     "[presence]\ngrace_s = 6666666666666666666666666666666666666666666666666666666666662.5",
                     "[pam]\nallowed_uids = [207, 1444444444001]", "[pam]\nallowed_uids = [4294967295]", "[pam]\nallowed_uids = [-1]"])
    func malformedLinesAreErrorsNotCrashes(_ text: String) {
        #expect(throws: DaemonConfig.Error.self) { try DaemonConfig.parse(text) }
    }

    @Test func windowsLineEndingsAreFine() throws {
        #expect(try DaemonConfig.parse("[box]\r\nid = \"4821\"\r\n").boxID?.description == "4821")
    }

    @Test func unknownKeysAndBadValuesAreNamed() {
        #expect(throws: DaemonConfig.Error("config: unknown key typo in [radio]")) { try DaemonConfig.parse("[radio]\ntypo = 1") }
        #expect(throws: DaemonConfig.Error("config: [presence] rssi_return_dbm must be above rssi_lock_dbm (hysteresis)")) {
            try DaemonConfig.parse("[presence]\nrssi_lock_dbm = -60\nrssi_return_dbm = -70")
        }
    }
}
