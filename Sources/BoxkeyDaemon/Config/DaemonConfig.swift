import BoxkeyHost
import BoxkeyCore
import FoundationEssentials
import Glibc

/// `/etc/boxkey/boxkeyd.conf` (flat TOML: `ConfigFile`). Every key is optional; docs/operations.md lists them
/// with their defaults, which are the values below.
public struct DaemonConfig: Sendable, Equatable {
    public typealias RadioBackend = BoxkeyHost.RadioBackend
    public enum Policy: String, Sendable { case lock, logout, none }
    /// How a phone logs a user in (docs/login-modes.md). `password`: the phone pushes the
    /// user's password and the site's PAM stack verifies it. `key`: an enrolled phone's
    /// authenticated, intended login is enough, in `keyServices`, through a `pam_boxkey.so key`
    /// stack line; no password is stored anywhere. `escrow`: the phone stores no password;
    /// the box keeps the user's verified password sealed under a secret only the phone holds.
    public enum LoginMode: String, Sendable { case password, key, escrow }

    // [box]
    public var boxID: BoxID?
    public var stateDirectory = "/var/lib/boxkey"
    // [radio]
    /// BlueZ unless the file asks for another: an installed box waits for its adapter rather
    /// than serving a simulated radio no phone can hear.
    public var radio: RadioBackend = .bluez
    public var adapter = ""
    public var advertisingInterval: Duration = .milliseconds(100)
    public var nonceRotation: Duration = .seconds(60)
    public var simDirectory = ""
    public var simPosition = 0.0
    // [sessions]
    public var handshakeTimeout: Duration = .seconds(5)
    public var commandTimeout: Duration = .seconds(10)
    public var outcomeTimeout: Duration = .seconds(60)
    public var maxConnections = 8
    // [limits]
    public var failedHandshakesPerMinute = 20
    public var rejectedPushesPerPhone = 5
    public var rejectedPushesPerUser = 10
    public var rejectionWindow: Duration = .seconds(15 * 60)
    // [enrolment]
    public var pairingCodeLifetime: Duration = .seconds(120)
    public var pairingCodeTries = 3
    public var pendingEnrolment: Duration = .seconds(300)
    /// Whether phones may be enrolled for root (uid 0): off, so that no code read off a screen
    /// and no admin slip makes a phone a root key.
    public var enrolRoot = false
    // [presence]
    public var policy: Policy = .lock
    /// What walk-away does with a session logind locked that did not then say it is locked
    /// (LockedHint) within `lockConfirm`: nothing on it follows logind's Lock (a text console, a
    /// desktop without a logind-aware locker), so it is still open to whoever sits down.
    public enum NotLocked: String, Sendable { case logout, keep }
    public var notLocked: NotLocked = .logout
    public var lockConfirm: Duration = .seconds(5)
    public var grace: Duration = .seconds(5)
    public var rssiLockThreshold = -80
    public var rssiReturnThreshold = -60
    public var rssiSamples = 5
    public var rssiInterval: Duration = .seconds(1)
    public var awayAfter: Duration = .seconds(5)
    /// No sealed keepalive for this long counts as walking away (the phone sends one every
    /// `BoxkeyProtocol.keepaliveInterval`, 2 s).
    public var keepaliveTimeout: Duration = .seconds(6)
    // [pam]
    public var pamSocket = "/run/boxkey/pam.sock"
    /// The admin socket, beside the PAM socket: `admin.sock` for `pam.sock` (`admin-4822.sock`
    /// for `pam-4822.sock`). Root only; up whenever the daemon runs, radio or not.
    public var adminSocket: String {
        let folder = pamSocket.parentDirectory
        let name = String(pamSocket.split(separator: "/").last ?? "pam.sock")
        let admin = name.hasPrefix("pam") ? "admin" + name.dropFirst(3) : name + ".admin"
        return folder == "/" ? "/" + admin : folder + "/" + admin
    }
    /// What the box guards, kept for the next daemon (`GuardFile`), beside the PAM socket:
    /// `guard.json` for `pam.sock` (`guard-4822.json` for `pam-4822.sock`).
    public var guardFile: String {
        let folder = pamSocket.parentDirectory
        var name = String(pamSocket.split(separator: "/").last ?? "pam.sock")
        if name.hasSuffix(".sock") { name.removeLast(5) }
        let file = (name.hasPrefix("pam") ? "guard" + name.dropFirst(3) : name + ".guard") + ".json"
        return folder == "/" ? "/" + file : folder + "/" + file
    }
    /// What loading the file found that is not an error (a key an older release had), for
    /// the journal, `--check-config` and doctor.
    public var warnings: [String] = []
    /// Who may use the PAM socket besides root (tests run unprivileged). Empty: root only.
    public var pamAllowedUIDs: [UInt32] = []
    /// How long a proximity offer stays at a prompt for Enter, and the cap on the module's
    /// `timeout=` (its wait after Enter for a phone on its way).
    public var maxPromptWait: Duration = .seconds(120)
    /// How long a phone's push waits at the prompt it went to for Enter there. The person who
    /// pushed is at the box; a push left waiting longer is one someone else could use.
    public var enterWait: Duration = .seconds(30)
    /// PAM services that may offer phone login: display managers, console login, screen
    /// lockers. Never sudo, su, polkit-1, sshd or cron unless an admin adds them.
    public var phoneLoginServices: Set<String> = DaemonConfig.defaultPhoneLoginServices

    /// The box's own password-only PAM service (`/etc/pam.d/boxkey-verify`), run as root: it
    /// confirms a pending phone's pushed password before enrolling it, and verifies pushes for
    /// screen lockers that run as the user (`[unlock]`).
    public var verifyService = "boxkey-verify"
    // [login]
    public var loginMode: LoginMode = .password
    /// Users who log in in key (or escrow) mode whatever `loginMode` says.
    public var keyUsers: Set<String> = []
    public var escrowUsers: Set<String> = []
    /// Proximity login: an enrolled phone's agent that is near may offer a login at a waiting
    /// prompt, which the person completes with Enter there. Off unless the box opts in.
    public var proximity = false
    /// Services where a key login may succeed (and phone login is offered at all: `[pam]
    /// services`). Greeters and lockers by default; the PAM line (`key`) is the second gate.
    public var keyServices: Set<String> = DaemonConfig.defaultPhoneLoginServices

    /// The mode `user` logs in with.
    public func loginMode(for user: String) -> LoginMode {
        keyUsers.contains(user) ? .key : escrowUsers.contains(user) ? .escrow : loginMode
    }

    // [unlock]
    /// Screen lockers that run as the user cannot reach the root-only socket. With this on, a
    /// push that finds no prompt but one locked local session of that user is verified through
    /// `verifyService` and the session unlocked through logind.
    public var logindUnlock = false

    // [fleet]
    /// The fleet directory (docs/fleet.md): phones enrolled once for every box. Nil: this box
    /// knows only its own enrolments.
    public var fleet: Fleet?

    public struct Fleet: Sendable, Equatable {
        /// ldaps://host, ldap://host with `startTLS`, or ldapi:// (a local socket).
        public var uri: String
        /// Where the users' entries are (searched as a subtree).
        public var base: String
        /// The box's service account (read the phones; write them only with `publish`).
        /// Empty: anonymous; "EXTERNAL": SASL EXTERNAL over ldapi://.
        public var bindDN = ""
        public var bindPasswordFile = "/etc/boxkey/fleet-bind-password"
        public var caFile = ""
        public var startTLS = false
        /// Whether the box follows the directory's changes as they happen (RFC 4533 content
        /// synchronisation, refreshAndPersist: OpenLDAP's syncprov overlay). Off, or a server
        /// that refuses it: the whole roster is read every `refresh`.
        public var follow = true
        /// Following: how often the box proves the directory is still there (a one-entry read)
        /// and reads the revocation list. Polling: how often it reads the whole roster, the
        /// longest a revocation takes to reach it.
        public var refresh: Duration = .seconds(60)
        /// How long the box trusts its last read while the directory is away; then fleet
        /// phones are refused (passwords still work).
        public var maxStale: Duration = .seconds(3600)
        /// Whether a phone enrolled here by a pairing code is published to the directory for
        /// every box (the service account needs write access to `boxkeyPhone`).
        public var publish = false
        /// The attribute that holds the login name.
        public var userAttribute = "uid"
        /// Every network wait (connect, TLS, bind, each page).
        public var timeout: Duration = .seconds(5)
        /// The entry that holds the fleet's signed revocation list of box certificates
        /// (`boxkeyBoxRevocations`); empty: this fleet does not certify boxes.
        public var revocationsDN = ""

        public init(uri: String, base: String) { self.uri = uri; self.base = base }
    }

    /// Not sddm: SDDM opens PAM only when its form is sent and answers every prompt from it at
    /// once, so no push can wait there; and SDDM 0.19 (Debian 12) never answered the password
    /// prompt that follows the module's line, typed passwords too (Tests/box/test_plasma.py).
    public static let defaultPhoneLoginServices: Set<String> = [
        "login", "gdm-password", "lightdm", "lightdm-greeter", "lxdm", "greetd",
        "xscreensaver", "gnome-screensaver", "cinnamon-screensaver", "mate-screensaver", "xfce4-screensaver",
        "kde", "kscreenlocker", "swaylock", "i3lock", "light-locker", "slock", "xsecurelock",
    ]

    public init() {}

    /// A key that SIGHUP cannot change: its name, and how to compare and keep its value.
    struct RestartOnlyKey: Sendable {
        let name: String
        let differs: @Sendable (DaemonConfig, DaemonConfig) -> Bool
        let keep: @Sendable (inout DaemonConfig, DaemonConfig) -> Void

        init<T: Equatable & Sendable>(_ name: String, _ path: WritableKeyPath<DaemonConfig, T> & Sendable) {
            self.name = name
            differs = { $0[keyPath: path] != $1[keyPath: path] }
            keep = { $0[keyPath: path] = $1[keyPath: path] }
        }
    }

    /// What SIGHUP cannot change: the box's identity and files, the radio, and the PAM socket
    /// (created, and handed to `allowed_uids`, at start).
    static let restartOnly: [RestartOnlyKey] = [
        .init("[box] id", \.boxID),
        .init("[box] state_directory", \.stateDirectory),
        .init("[radio] backend", \.radio),
        .init("[radio] adapter", \.adapter),
        .init("[radio] advertising_interval_ms", \.advertisingInterval),
        .init("[radio] nonce_rotation_s", \.nonceRotation),
        .init("[radio] sim_directory", \.simDirectory),
        .init("[radio] sim_position", \.simPosition),
        .init("[pam] socket", \.pamSocket),
        .init("[pam] allowed_uids", \.pamAllowedUIDs),
        .init("[fleet]", \.fleet),
    ]

    /// The settings (by their names here) whose values differ between the two.
    public func changes(to other: DaemonConfig) -> [String] {
        let mine = Mirror(reflecting: self).children, theirs = Mirror(reflecting: other).children
        return zip(mine, theirs).compactMap { a, b in
            a.label == "warnings" || "\(a.value)" == "\(b.value)" ? nil : a.label
        }
    }

    /// `reloaded` with the keys that need a restart kept as they are now, and the names of
    /// those keys whose value differs there.
    public func reloading(_ reloaded: DaemonConfig) -> (config: DaemonConfig, needRestart: [String]) {
        var next = reloaded
        for key in Self.restartOnly { key.keep(&next, self) }
        return (next, Self.restartOnly.filter { $0.differs(self, reloaded) }.map(\.name))
    }

    public struct Error: Swift.Error, CustomStringConvertible, Equatable {
        public let description: String
        init(_ d: String) { description = d }
    }

    /// The drop-ins beside `path` (`boxkeyd.conf.d/*.conf`), in the order they apply: by name.
    public static func dropIns(of path: String) -> [String] {
        let folder = path + ".d"
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder) else { return [] }
        return names.filter { $0.hasSuffix(".conf") && !$0.hasPrefix(".") }.sorted().map { folder + "/" + $0 }
    }

    /// The file, then its drop-ins (`boxkeyd.conf.d/*.conf`, by name: systemd's convention):
    /// a later file's key overrides an earlier one's, and a section may appear in several
    /// files. Each file is checked on its own first, so an error names its file and line; then
    /// all together. A missing main file is every default (unless `missingIsError`: a reload
    /// must not quietly widen the services and limits back to the defaults), drop-ins still
    /// apply.
    public static func load(path: String, missingIsError: Bool = false) throws -> DaemonConfig {
        var files: [(path: String, text: String)] = []
        if FileManager.default.fileExists(atPath: path) {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
                throw Error("\(path): cannot read the file")
            }
            if missingIsError, !text.split(separator: "\n").contains(where: { let t = String($0).trimmed; return !t.hasPrefix("#") && t.contains("=") }) {
                // Empty, or caught half-written: not "every default".
                throw Error("\(path): no settings in the file")
            }
            if let problem = ownershipProblem(path) { throw Error(problem) }
            files.append((path, text))
        } else if missingIsError {
            throw Error("\(path): no such file")
        }
        let dropIns = dropIns(of: path)
        if !dropIns.isEmpty, let problem = ownershipProblem(path + ".d") { throw Error(problem) }
        for file in dropIns {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { throw Error("\(file): cannot read the file") }
            if let problem = ownershipProblem(file) { throw Error(problem) }
            files.append((file, text))
        }
        guard !files.isEmpty else { return DaemonConfig() }
        var warnings: [String] = []
        var merged = ConfigFile()
        var only: DaemonConfig?
        for file in files {
            let table = try table(file.text, source: file.path)
            only = try parse(table, source: file.path)
            warnings += only!.warnings
            merged.merge(table)
        }
        if files.count == 1, let only { return only }
        var config = try parse(merged, source: "\(path) with \(dropIns.map { String($0.split(separator: "/").last ?? "") }.joined(separator: ", "))")
        config.warnings = warnings
        return config
    }

    /// `[pam] socket` as the file (or a drop-in, the last one wins) says it, read leniently
    /// from the lines alone: an admin command finds the running daemon while the file has an
    /// error elsewhere.
    public static func socketLine(in path: String) -> String? {
        var found: String?
        for file in [path] + dropIns(of: path) {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { continue }
            var section = ""
            for raw in text.split(separator: "\n", omittingEmptySubsequences: false) {
                let line = String(raw).trimmed
                if line.hasPrefix("[") { section = String(line.dropFirst().prefix { $0 != "]" }).trimmed; continue }
                guard section == "pam", line.hasPrefix("socket") else { continue }
                let parts = line.split(separator: "=", maxSplits: 1)
                guard parts.count == 2, String(parts[0]).trimmed == "socket" else { continue }
                let value = parts[1].split(separator: "#", maxSplits: 1).first.map { String($0).trimmed } ?? ""
                if value.count >= 2, value.first == "\"" || value.first == "'", value.last == value.first { found = String(value.dropFirst().dropLast()) }
            }
        }
        return found
    }

    /// The configuration decides who may log in how: a file another account could write is not
    /// read. It must belong to root (or to the user the daemon runs as) and be writable by no
    /// one else.
    public static func ownershipProblem(_ path: String) -> String? {
        var s = stat()
        guard stat(path, &s) == 0 else { return nil }
        let me = geteuid()
        if s.st_uid != 0, s.st_uid != me {
            return "\(path) belongs to uid \(s.st_uid): not read (it must be root's). Run: chown root: \(path)"
        }
        if s.st_mode & 0o022 != 0 {
            return "\(path) has mode \(String(s.st_mode & 0o7777, radix: 8)): others may write it, so it is not read. Run: chmod go-w \(path)"
        }
        return nil
    }
}
