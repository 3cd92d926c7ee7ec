@testable import BoxkeyDaemon
import Foundation
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
        #expect(c.maxConnections == 8)   // untouched keys keep their defaults
    }

    /// Inputs that made the TOML library used before (TOMLKit's toml++) abort the process, and
    /// their kin: each is an error naming the line, never a crash.
    @Test(arguments: ["[)x]", "[box]\nid = \"48\\n21\"", "[box\nid = 1", "[box]\nid = \"48\\q21\"", "id = [1, \"a\"]", "= 3", "[box]\nid = 'x'", "[Box]", "key = tru", "k = 1.2.3",
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
        #expect(throws: DaemonConfig.Error("config line 2: unknown key typo in [radio]")) { try DaemonConfig.parse("[radio]\ntypo = 1") }
        #expect(throws: DaemonConfig.Error("config line 3: [presence] rssi_return_dbm must be above rssi_lock_dbm (hysteresis)")) {
            try DaemonConfig.parse("[presence]\nrssi_lock_dbm = -60\nrssi_return_dbm = -70")
        }
    }

    @Test func aKeyAnOlderReleaseHadIsAWarningNotAFailure() throws {
        // dpkg keeps an edited conffile across an upgrade: 0.5's key must not stop the daemon.
        let c = try DaemonConfig.parse("[limits]\nrejected_pushes_per_phone = 4\nrejected_pushes_total = 20\n")
        #expect(c.rejectedPushesPerPhone == 4)
        #expect(c.warnings == ["config line 3: [limits] rejected_pushes_total is no longer used (gone since 0.5.0 (rejections are counted per phone, per user and for new phones)): ignored; take it out of the file"])
        // A typo is still an error.
        #expect(throws: DaemonConfig.Error("config line 2: unknown key rejected_pushes_totl in [limits]")) { try DaemonConfig.parse("[limits]\nrejected_pushes_totl = 20") }
    }

    @Test func dropInsOverrideKeysAndMayRepeatSections() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-conf-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        try FileManager.default.createDirectory(atPath: folder + "/boxkeyd.conf.d", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        chmod(folder + "/boxkeyd.conf.d", 0o755)
        let main = folder + "/boxkeyd.conf"
        // The shipped file has every header; a drop-in repeats one.
        try "[presence]\ngrace_s = 5\n[pam]\nsocket = \"/run/x/pam.sock\"\n".write(toFile: main, atomically: true, encoding: .utf8)
        try "[presence]\ngrace_s = 2\n".write(toFile: folder + "/boxkeyd.conf.d/50-site.conf", atomically: true, encoding: .utf8)
        try "[presence]\ngrace_s = 3\npolicy = \"logout\"\n".write(toFile: folder + "/boxkeyd.conf.d/90-host.conf", atomically: true, encoding: .utf8)
        try "not a drop-in".write(toFile: folder + "/boxkeyd.conf.d/README", atomically: true, encoding: .utf8)
        for f in [main, folder + "/boxkeyd.conf.d/50-site.conf", folder + "/boxkeyd.conf.d/90-host.conf"] { chmod(f, 0o644) }
        let c = try DaemonConfig.load(path: main)
        #expect(c.grace == .seconds(3) && c.policy == .logout && c.pamSocket == "/run/x/pam.sock")
        // An error in a drop-in names the drop-in and its line.
        try "[presence]\ngrace_s = \"two\"\n".write(toFile: folder + "/boxkeyd.conf.d/95-bad.conf", atomically: true, encoding: .utf8)
        chmod(folder + "/boxkeyd.conf.d/95-bad.conf", 0o644)
        #expect(throws: (any Error).self) { try DaemonConfig.load(path: main) }
        do { _ = try DaemonConfig.load(path: main) } catch { #expect("\(error)".contains("95-bad.conf line 2")) }
        // An admin command still finds the socket.
        #expect(DaemonConfig.socketLine(in: main) == "/run/x/pam.sock")
    }

    @Test func pamServicesAreFileNames() throws {
        #expect(try DaemonConfig.parse("[pam]\nservices = [\"login\", \"gdm-password\"]").phoneLoginServices == ["login", "gdm-password"])
        #expect(throws: DaemonConfig.Error("config line 2: [pam] services: \"../sudo\" is not a PAM service name")) {
            try DaemonConfig.parse("[pam]\nservices = [\"login\", \"../sudo\"]")
        }
        #expect(throws: DaemonConfig.Error("config line 2: [pam] services must be a list of PAM service names")) {
            try DaemonConfig.parse("[pam]\nservices = \"login\"")
        }
    }

    @Test func loginModesPerBoxAndPerUser() throws {
        let defaults = DaemonConfig()
        #expect(defaults.loginMode == .password && defaults.loginMode(for: "alice") == .password)
        let c = try DaemonConfig.parse("[login]\nkey_users = [\"alice\"]\nkey_services = [\"gdm-password\"]")
        #expect(c.loginMode(for: "alice") == .key && c.loginMode(for: "bob") == .password)
        #expect(c.keyServices == ["gdm-password"])
        #expect(try DaemonConfig.parse("[login]\nmode = \"key\"").loginMode(for: "bob") == .key)
        let escrow = try DaemonConfig.parse("[login]\nmode = \"key\"\nescrow_users = [\"carol\"]")
        #expect(escrow.loginMode(for: "carol") == .escrow && escrow.loginMode(for: "bob") == .key)
        #expect(throws: DaemonConfig.Error("config line 3: [login] alice is in both key_users and escrow_users")) {
            try DaemonConfig.parse("[login]\nkey_users = [\"alice\"]\nescrow_users = [\"alice\"]")
        }
        #expect(throws: DaemonConfig.Error("config line 2: [login] mode must be password, key or escrow")) { try DaemonConfig.parse("[login]\nmode = \"none\"") }
        #expect(throws: DaemonConfig.Error("config line 2: [login] key_users: \"a b\" is not a user name")) { try DaemonConfig.parse("[login]\nkey_users = [\"a b\"]") }
        #expect(throws: DaemonConfig.Error("config line 2: [login] key_services: \"../sudo\" is not a PAM service name")) {
            try DaemonConfig.parse("[login]\nkey_services = [\"../sudo\"]")
        }
    }
}

/// The syntax of boxkeyd.conf on its own: what TOML allows in a flat file parses as TOML says,
/// the rest is an error naming the line.
@Suite struct ConfigFileTests {
    func values(_ text: String) throws -> [String: ConfigFile.Value] {
        let file = try ConfigFile.parse(text)
        var out: [String: ConfigFile.Value] = [:]
        for s in file.sections { for (k, e) in s.entries { out["\(s.name).\(k)"] = e.value } }
        return out
    }

    @Test func tomlValuesParseAsTOMLSaysTheyDo() throws {
        let v = try values(#"""
            # a comment, then blank lines

            [ a ]   # spaces in the header
            basic = "tab\tquote\"back\\u\u00e9U\U0001F511"
            literal = 'C:\no\escapes'
            int = -1_000
            plus = +7
            zero = 0
            float = 2.5e-1
            exp = 1E3
            yes = true
            no = false
            list = [ 1, 2,
                     3, # a comment inside a list
                   ]
            empty = []
            strings = ["x", 'y']
            [b]
            key-with_dashes = 1
            """#)
        #expect(v["a.basic"] == .string("tab\tquote\"back\\u\u{e9}U\u{1F511}"))
        #expect(v["a.literal"] == .string(#"C:\no\escapes"#))
        #expect(v["a.int"] == .integer(-1000) && v["a.plus"] == .integer(7) && v["a.zero"] == .integer(0))
        #expect(v["a.float"] == .float(0.25) && v["a.exp"] == .float(1000))
        #expect(v["a.yes"] == .bool(true) && v["a.no"] == .bool(false))
        #expect(v["a.list"] == .array([.integer(1), .integer(2), .integer(3)]) && v["a.empty"] == .array([]))
        #expect(v["a.strings"] == .array([.string("x"), .string("y")]))
        #expect(v["b.key-with_dashes"] == .integer(1))
    }

    @Test(arguments: [
        ("[a]\nk = 1\nk = 2", 3, "k appears twice in [a]"),
        ("[a]\n[a]", 2, "section [a] appears twice (TOML allows a table to be defined once)"),
        ("k = 1", 1, "k is outside any [section]"),
        ("[a]\nx.y = 1", 2, "dotted keys are not used in boxkeyd.conf: write [section] and key = value"),
        ("[a.b]", 1, "dotted section names are not used in boxkeyd.conf"),
        ("[[a]]", 1, "arrays of tables ([[…]]) are not used in boxkeyd.conf"),
        ("[a]\n\"k\" = 1", 2, "quoted names are not used in boxkeyd.conf"),
        ("[a]\nk = { x = 1 }", 2, "inline tables are not used in boxkeyd.conf"),
        ("[a]\nk = \"\"\"x\"\"\"", 2, "multi-line strings are not used in boxkeyd.conf"),
        ("[a]\nk = 0x1f", 2, "write 0x1f in decimal"),
        ("[a]\nk = 1979-05-27", 2, "not a number: 1979-05-27"),
        ("[a]\nk = 012", 2, "leading zeros are not allowed: 012"),
        ("[a]\nk = 1__0", 2, "not a number: 1__0"),
        ("[a]\nk = 1.", 2, "not a number: 1."),
        ("[a]\nk = inf", 2, "not a value: 'i' (strings need quotes)"),
        ("[a]\nk = 99999999999999999999", 2, "99999999999999999999 is out of range"),
        ("[a]\nk = \"open", 2, "a string is not closed with \""),
        ("[a]\nk = \"open\nj = 1", 2, "a string is not closed with \" on its line"),
        ("[a]\nk = \"\\ud800\"", 2, "a \\u or \\U escape needs 4 hex digits naming a Unicode scalar"),
        ("[a]\nk = [1, 2", 2, "an array is not closed with ]"),
        ("[a]\nk = [1 2]", 2, "expected , or ] in an array, found '2'"),
        ("[a]\nk = [[[[[1]]]]]", 2, "arrays nested too deep"),
        ("[a]\nk = 1 2", 2, "unexpected '2' after the value"),
        ("[a]\nk =", 2, "a value is missing"),
        ("[a]\r\nk = 1\r[b]", 2, "a carriage return without a line feed"),
        ("[a] # bell \u{7}", 1, "control character byte 0x07 in a comment"),
        ("[a]\nk = \"\u{0}\"", 2, "control character byte 0x00 in a string"),
    ] as [(String, Int, String)])
    func errorsNameTheLine(_ text: String, _ line: Int, _ message: String) {
        #expect(throws: ConfigFile.SyntaxError(line: line, message: message)) { try ConfigFile.parse(text) }
    }
}
