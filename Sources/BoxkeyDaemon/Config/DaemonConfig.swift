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

    public static let defaultPhoneLoginServices: Set<String> = [
        "login", "gdm-password", "lightdm", "lightdm-greeter", "sddm", "lxdm", "greetd",
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
            "\(a.value)" == "\(b.value)" ? nil : a.label
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

    /// A missing file is every default, unless `missingIsError` (a reload: a file moved away
    /// must not quietly widen the services and limits back to the defaults).
    public static func load(path: String, missingIsError: Bool = false) throws -> DaemonConfig {
        guard FileManager.default.fileExists(atPath: path) else {
            if missingIsError { throw Error("\(path): no such file") }
            return DaemonConfig()
        }
        if missingIsError, let text = try? String(contentsOfFile: path, encoding: .utf8),
           !text.split(separator: "\n").contains(where: { let t = String($0).trimmed; return !t.hasPrefix("#") && t.contains("=") }) {
            // Empty, or caught half-written: not "every default".
            throw Error("\(path): no settings in the file")
        }
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw Error("\(path): cannot read the file")
        }
        if let problem = ownershipProblem(path) { throw Error(problem) }
        return try parse(text, source: path)
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

    /// Parses and validates; unknown sections and keys are errors, so a typo never silently
    /// falls back to a default. Every error names the file and the line.
    public static func parse(_ text: String, source: String = "config") throws -> DaemonConfig {
        let table: ConfigFile
        do { table = try ConfigFile.parse(text) } catch {
            throw Error("\(source) \(error)")
        }
        var c = DaemonConfig()
        let reader = Reader(source: source)
        try reader.sections(table, allowed: ["box", "radio", "sessions", "limits", "presence", "pam", "enrolment", "unlock", "login", "fleet"])
        if let t = try reader.section(table, "fleet", keys: ["uri", "base", "bind_dn", "bind_password_file", "ca_file", "starttls", "refresh_s", "max_stale_s", "publish", "user_attribute", "timeout_s", "revocations_dn", "follow"]), !t.entries.isEmpty {
            // An empty [fleet] (the shipped file's, every key commented out) is no fleet.
            guard let uri = try reader.string(t, "uri"), let base = try reader.string(t, "base") else {
                throw reader.error(t.line, "[fleet] needs uri and base (docs/fleet.md)")
            }
            var f = Fleet(uri: uri, base: base)
            f.startTLS = try reader.bool(t, "starttls") ?? f.startTLS
            // The service account's password crosses the network: never in clear.
            let scheme = uri.lowercased()
            guard scheme.hasPrefix("ldaps://") || scheme.hasPrefix("ldapi://") || (scheme.hasPrefix("ldap://") && f.startTLS) else {
                throw reader.error(t["uri"]!.line, "[fleet] uri must be ldaps://, ldapi://, or ldap:// with starttls = true (the directory is never read in clear)")
            }
            // libldap takes a list (spaces or commas): a second, clear one would get the password.
            guard !uri.contains(where: { $0.isWhitespace || $0 == "," }) else { throw reader.error(t["uri"]!.line, "[fleet] uri is one URI") }
            f.bindDN = try reader.string(t, "bind_dn") ?? f.bindDN
            f.bindPasswordFile = try reader.string(t, "bind_password_file") ?? f.bindPasswordFile
            f.caFile = try reader.string(t, "ca_file") ?? f.caFile
            f.follow = try reader.bool(t, "follow") ?? f.follow
            f.refresh = try reader.seconds(t, "refresh_s", 5...86_400) ?? f.refresh
            f.maxStale = try reader.seconds(t, "max_stale_s", 60...2_592_000) ?? f.maxStale
            guard f.maxStale > f.refresh else { throw reader.error((t["max_stale_s"] ?? t["refresh_s"])!.line, "[fleet] max_stale_s must be longer than refresh_s") }
            f.publish = try reader.bool(t, "publish") ?? f.publish
            f.userAttribute = try reader.string(t, "user_attribute") ?? f.userAttribute
            guard !f.userAttribute.isEmpty, f.userAttribute.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") }) else {
                throw reader.error(t["user_attribute"]!.line, "[fleet] user_attribute must be an attribute name")
            }
            f.timeout = try reader.seconds(t, "timeout_s", 1...60) ?? f.timeout
            f.revocationsDN = try reader.string(t, "revocations_dn") ?? f.revocationsDN
            c.fleet = f
        }
        if let t = try reader.section(table, "login", keys: ["mode", "key_users", "escrow_users", "key_services", "proximity"]) {
            c.proximity = try reader.bool(t, "proximity") ?? c.proximity
            if let m = try reader.string(t, "mode") {
                guard let mode = LoginMode(rawValue: m) else { throw reader.error(t["mode"]!.line, "[login] mode must be password, key or escrow") }
                c.loginMode = mode
            }
            c.keyUsers = try reader.users(t, "key_users") ?? c.keyUsers
            c.escrowUsers = try reader.users(t, "escrow_users") ?? c.escrowUsers
            if let both = c.keyUsers.intersection(c.escrowUsers).sorted().first {
                throw reader.error(t["escrow_users"]!.line, "[login] \(logSafe(both)) is in both key_users and escrow_users")
            }
            c.keyServices = try reader.services(t, "key_services") ?? c.keyServices
        }
        if let t = try reader.section(table, "unlock", keys: ["logind_unlock"]) {
            c.logindUnlock = try reader.bool(t, "logind_unlock") ?? c.logindUnlock
        }
        if let t = try reader.section(table, "box", keys: ["id", "state_directory"]) {
            if let id = try reader.string(t, "id") {
                guard let boxID = BoxID(id) else { throw reader.error(t["id"]!.line, "[box] id must be four digits, got \"\(logSafe(id))\"") }
                c.boxID = boxID
            }
            c.stateDirectory = try reader.string(t, "state_directory") ?? c.stateDirectory
        }
        if let t = try reader.section(table, "radio", keys: ["backend", "adapter", "advertising_interval_ms", "nonce_rotation_s", "sim_directory", "sim_position"]) {
            if let b = try reader.string(t, "backend") {
                guard let backend = RadioBackend(rawValue: b) else { throw reader.error(t["backend"]!.line, "[radio] backend must be auto, simulated or bluez") }
                c.radio = backend
            }
            c.adapter = try reader.string(t, "adapter") ?? c.adapter
            c.advertisingInterval = try reader.milliseconds(t, "advertising_interval_ms", 20...10_240) ?? c.advertisingInterval
            c.nonceRotation = try reader.seconds(t, "nonce_rotation_s", 5...3600) ?? c.nonceRotation
            c.simDirectory = try reader.string(t, "sim_directory") ?? c.simDirectory
            c.simPosition = try reader.double(t, "sim_position") ?? c.simPosition
        }
        if let t = try reader.section(table, "sessions", keys: ["handshake_timeout_s", "command_timeout_s", "outcome_timeout_s", "max_connections"]) {
            c.handshakeTimeout = try reader.seconds(t, "handshake_timeout_s", 1...60) ?? c.handshakeTimeout
            c.commandTimeout = try reader.seconds(t, "command_timeout_s", 1...120) ?? c.commandTimeout
            c.outcomeTimeout = try reader.seconds(t, "outcome_timeout_s", 5...600) ?? c.outcomeTimeout
            c.maxConnections = try reader.int(t, "max_connections", 1...32) ?? c.maxConnections
        }
        if let t = try reader.section(table, "limits", keys: ["failed_handshakes_per_minute", "rejected_pushes_per_phone", "rejected_pushes_per_user", "rejection_window_s"]) {
            c.failedHandshakesPerMinute = try reader.int(t, "failed_handshakes_per_minute", 1...10_000) ?? c.failedHandshakesPerMinute
            c.rejectedPushesPerPhone = try reader.int(t, "rejected_pushes_per_phone", 1...1000) ?? c.rejectedPushesPerPhone
            c.rejectedPushesPerUser = try reader.int(t, "rejected_pushes_per_user", 1...10_000) ?? c.rejectedPushesPerUser
            c.rejectionWindow = try reader.seconds(t, "rejection_window_s", 10...86_400) ?? c.rejectionWindow
        }
        if let t = try reader.section(table, "enrolment", keys: ["code_lifetime_s", "code_tries", "pending_s", "root"]) {
            c.pairingCodeLifetime = try reader.seconds(t, "code_lifetime_s", 30...600) ?? c.pairingCodeLifetime
            c.pairingCodeTries = try reader.int(t, "code_tries", 1...10) ?? c.pairingCodeTries
            c.pendingEnrolment = try reader.seconds(t, "pending_s", 30...3600) ?? c.pendingEnrolment
            c.enrolRoot = try reader.bool(t, "root") ?? c.enrolRoot
        }
        if let t = try reader.section(table, "presence", keys: ["policy", "grace_s", "rssi_lock_dbm", "rssi_return_dbm", "rssi_samples", "rssi_interval_ms", "away_after_s", "keepalive_timeout_s",
                                                               "not_locked", "lock_confirm_s"]) {
            if let p = try reader.string(t, "policy") {
                guard let policy = Policy(rawValue: p) else { throw reader.error(t["policy"]!.line, "[presence] policy must be lock, logout or none") }
                c.policy = policy
            }
            if let n = try reader.string(t, "not_locked") {
                guard let notLocked = NotLocked(rawValue: n) else { throw reader.error(t["not_locked"]!.line, "[presence] not_locked must be logout or keep") }
                c.notLocked = notLocked
            }
            c.lockConfirm = try reader.seconds(t, "lock_confirm_s", 1...60) ?? c.lockConfirm
            c.grace = try reader.milliseconds(t, "grace_s", 0...3_600_000, scale: 1000) ?? c.grace
            c.rssiLockThreshold = try reader.int(t, "rssi_lock_dbm", -120...0) ?? c.rssiLockThreshold
            c.rssiReturnThreshold = try reader.int(t, "rssi_return_dbm", -120...0) ?? c.rssiReturnThreshold
            c.rssiSamples = try reader.int(t, "rssi_samples", 1...100) ?? c.rssiSamples
            c.rssiInterval = try reader.milliseconds(t, "rssi_interval_ms", 100...60_000) ?? c.rssiInterval
            c.awayAfter = try reader.milliseconds(t, "away_after_s", 0...3_600_000, scale: 1000) ?? c.awayAfter
            // More than one keepalive interval (2 s), so a single late keepalive is not a walk-away.
            c.keepaliveTimeout = try reader.seconds(t, "keepalive_timeout_s", 3...600) ?? c.keepaliveTimeout
            guard c.rssiReturnThreshold > c.rssiLockThreshold else {
                throw reader.error((t["rssi_return_dbm"] ?? t["rssi_lock_dbm"])?.line ?? t.line, "[presence] rssi_return_dbm must be above rssi_lock_dbm (hysteresis)")
            }
        }
        if let t = try reader.section(table, "pam", keys: ["socket", "allowed_uids", "max_wait_s", "enter_wait_s", "services", "verify_service"]) {
            c.verifyService = try reader.string(t, "verify_service") ?? c.verifyService
            c.phoneLoginServices = try reader.services(t, "services") ?? c.phoneLoginServices
            c.pamSocket = try reader.string(t, "socket") ?? c.pamSocket
            if let uids = t["allowed_uids"] {
                let bad = reader.error(uids.line, "[pam] allowed_uids must be a list of user IDs (0 to 4294967294)")
                guard case .array(let array) = uids.value else { throw bad }
                c.pamAllowedUIDs = try array.map { v in
                    // A uid is 32 bits, and (uid_t)-1 means "no user" to the kernel.
                    guard case .integer(let n) = v, let uid = UInt32(exactly: n), uid != UInt32.max else { throw bad }
                    return uid
                }
            }
            c.maxPromptWait = try reader.seconds(t, "max_wait_s", 5...3600) ?? c.maxPromptWait
            c.enterWait = try reader.seconds(t, "enter_wait_s", 5...300) ?? c.enterWait
        }
        return c
    }

    /// Reads typed values out of the parsed file; each error names the line it is about.
    private struct Reader {
        let source: String

        func error(_ line: Int, _ message: String) -> Error { Error("\(source) line \(line): \(message)") }

        func sections(_ file: ConfigFile, allowed: Set<String>) throws {
            for s in file.sections where !allowed.contains(s.name) {
                throw error(s.line, "unknown section [\(s.name)]")
            }
        }
        func section(_ file: ConfigFile, _ name: String, keys: Set<String>) throws -> ConfigFile.Section? {
            guard let t = file[name] else { return nil }
            for (key, entry) in t.entries where !keys.contains(key) { throw error(entry.line, "unknown key \(key) in [\(name)]") }
            return t
        }
        func bool(_ t: ConfigFile.Section, _ k: String) throws -> Bool? {
            guard let e = t[k] else { return nil }
            guard case .bool(let b) = e.value else { throw error(e.line, "[\(t.name)] \(k) must be true or false") }
            return b
        }
        func string(_ t: ConfigFile.Section, _ k: String) throws -> String? {
            guard let e = t[k] else { return nil }
            guard case .string(let x) = e.value else { throw error(e.line, "[\(t.name)] \(k) must be a string") }
            return x
        }
        func strings(_ t: ConfigFile.Section, _ k: String, what: String) throws -> [String]? {
            guard let e = t[k] else { return nil }
            guard case .array(let items) = e.value else { throw error(e.line, "[\(t.name)] \(k) must be a list of \(what)") }
            return try items.map { v in
                guard case .string(let x) = v else { throw error(e.line, "[\(t.name)] \(k) must be a list of \(what)") }
                return x
            }
        }
        func users(_ t: ConfigFile.Section, _ k: String) throws -> Set<String>? {
            guard let users = try strings(t, k, what: "user names") else { return nil }
            if let bad = users.first(where: { $0.isEmpty || $0.contains(where: { $0.isWhitespace || $0.asciiValue.map { $0 < 0x20 || $0 == 0x7f } == true }) }) {
                throw error(t[k]!.line, "[\(t.name)] \(k): \"\(logSafe(bad))\" is not a user name")
            }
            return Set(users)
        }
        /// PAM service names: each a file name in /etc/pam.d.
        func services(_ t: ConfigFile.Section, _ k: String) throws -> Set<String>? {
            guard let names = try strings(t, k, what: "PAM service names") else { return nil }
            let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.@")
            if let bad = names.first(where: { $0.isEmpty || $0.hasPrefix(".") || !$0.allSatisfy(allowed.contains) }) {
                throw error(t[k]!.line, "[\(t.name)] \(k): \"\(logSafe(bad))\" is not a PAM service name")
            }
            return Set(names)
        }
        func int(_ t: ConfigFile.Section, _ k: String, _ range: ClosedRange<Int>) throws -> Int? {
            guard let e = t[k] else { return nil }
            guard case .integer(let x) = e.value, range.contains(x) else {
                throw error(e.line, "[\(t.name)] \(k) must be a whole number in \(range.lowerBound)...\(range.upperBound)")
            }
            return x
        }
        func double(_ t: ConfigFile.Section, _ k: String) throws -> Double? {
            guard let e = t[k] else { return nil }
            switch e.value {
            case .float(let d): return d
            case .integer(let i): return Double(i)
            default: throw error(e.line, "[\(t.name)] \(k) must be a number")
            }
        }
        func seconds(_ t: ConfigFile.Section, _ k: String, _ range: ClosedRange<Int>) throws -> Duration? {
            try int(t, k, range).map { .seconds($0) }
        }
        /// A whole number of milliseconds, or of seconds with `scale: 1000` (fractions allowed).
        func milliseconds(_ t: ConfigFile.Section, _ k: String, _ range: ClosedRange<Int>, scale: Double = 1) throws -> Duration? {
            guard let v = try double(t, k) else { return nil }
            // Check in Double first: converting a huge value to Int would trap.
            let scaled = (v * scale).rounded()
            guard scaled.isFinite, scaled >= Double(range.lowerBound), scaled <= Double(range.upperBound) else {
                throw error(t[k]!.line, "[\(t.name)] \(k) is out of range (\(describe(range, scale: scale)))")
            }
            return .milliseconds(Int(scaled))
        }
        private func describe(_ range: ClosedRange<Int>, scale: Double) -> String {
            scale == 1000 ? "\(Double(range.lowerBound) / 1000)...\(Double(range.upperBound) / 1000) s" : "\(range.lowerBound)...\(range.upperBound) ms"
        }
    }
}
