import BoxkeyHost
import BoxkeyCore
import FoundationEssentials
import Glibc

/// Reading `boxkeyd.conf`: each section and key checked and typed, each error naming its line.
extension DaemonConfig {
    /// Parses and validates; unknown sections and keys are errors, so a typo never silently
    /// falls back to a default. Every error names the file and the line.
    public static func parse(_ text: String, source: String = "config") throws -> DaemonConfig {
        try parse(table(text, source: source), source: source)
    }

    static func table(_ text: String, source: String) throws -> ConfigFile {
        do { return try ConfigFile.parse(text) } catch {
            throw Error("\(source) \(error)")
        }
    }

    /// Keys earlier releases had and this one does not: a file kept across an upgrade
    /// (dpkg keeps an edited conffile) still loads, with a warning. Any other unknown key is
    /// still an error: a typo must not quietly fall back to a default.
    static let retiredKeys: [String: [String: String]] = [
        "limits": ["rejected_pushes_total": "0.5.0 (rejections are counted per phone, per user and for new phones)"],
        "unlock": ["pam_service": "0.4.0 (the box checks with [pam] verify_service)"],
    ]

    static func parse(_ table: ConfigFile, source: String) throws -> DaemonConfig {
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
        c.warnings = reader.warnings
        return c
    }

    /// Reads typed values out of the parsed file; each error names the line it is about.
    private final class Reader {
        let source: String
        var warnings: [String] = []

        init(source: String) { self.source = source }

        func error(_ line: Int, _ message: String) -> Error { Error("\(source) line \(line): \(message)") }

        func sections(_ file: ConfigFile, allowed: Set<String>) throws {
            for s in file.sections where !allowed.contains(s.name) {
                throw error(s.line, "unknown section [\(s.name)]")
            }
        }
        func section(_ file: ConfigFile, _ name: String, keys: Set<String>) throws -> ConfigFile.Section? {
            guard let t = file[name] else { return nil }
            for (key, entry) in t.entries where !keys.contains(key) {
                guard let since = DaemonConfig.retiredKeys[name]?[key] else { throw error(entry.line, "unknown key \(key) in [\(name)]") }
                warnings.append("\(source) line \(entry.line): [\(name)] \(key) is no longer used (gone since \(since)): ignored; take it out of the file")
            }
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
