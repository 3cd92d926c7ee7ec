import BoxkeyHost
import BoxkeyCore
import Foundation
import TOMLKit

/// `/etc/boxkey/boxkeyd.conf` (TOML). Every key is optional; docs/operations.md lists them
/// with their defaults, which are the values below.
public struct DaemonConfig: Sendable, Equatable {
    public typealias RadioBackend = RadioChoice.Backend
    public enum Policy: String, Sendable { case lock, logout, none }

    // [box]
    public var boxID: BoxID?
    public var stateDirectory = "/var/lib/boxkey"
    // [radio]
    public var radio: RadioBackend = .auto
    public var adapter = ""
    public var advertisingInterval: Duration = .milliseconds(100)
    public var nonceRotation: Duration = .seconds(60)
    public var simDirectory = ""
    public var simPosition = 0.0
    // [sessions]
    public var handshakeTimeout: Duration = .seconds(5)
    public var commandTimeout: Duration = .seconds(10)
    public var outcomeTimeout: Duration = .seconds(60)
    public var maxConnections = 4
    // [limits]
    public var failedHandshakesPerMinute = 20
    public var rejectedPushesPerPhone = 5
    public var rejectedPushesPerUser = 10
    public var rejectionWindow: Duration = .seconds(15 * 60)
    // [enrolment]
    public var pairingCodeLifetime: Duration = .seconds(120)
    public var pairingCodeTries = 3
    public var pendingEnrolment: Duration = .seconds(300)
    // [presence]
    public var policy: Policy = .lock
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
    /// Who may use the PAM socket besides root (tests run unprivileged). Empty: root only.
    public var pamAllowedUIDs: [UInt32] = []
    public var maxPromptWait: Duration = .seconds(120)
    /// PAM services that may offer phone login: display managers, console login, screen
    /// lockers. Never sudo, su, polkit-1, sshd or cron unless an admin adds them.
    public var phoneLoginServices: Set<String> = DaemonConfig.defaultPhoneLoginServices

    /// The box's own password-only PAM service (`/etc/pam.d/boxkey-verify`), run as root: it
    /// confirms a pending phone's pushed password before enrolling it, and verifies pushes for
    /// screen lockers that run as the user (`[unlock]`).
    public var verifyService = "boxkey-verify"
    // [unlock]
    /// Screen lockers that run as the user cannot reach the root-only socket. With this on, a
    /// push that finds no prompt but one locked local session of that user is verified through
    /// `verifyService` and the session unlocked through logind.
    public var logindUnlock = false

    public static let defaultPhoneLoginServices: Set<String> = [
        "login", "gdm-password", "gdm-boxkey", "gdm-fingerprint", "lightdm", "lightdm-greeter", "sddm", "lxdm", "greetd",
        "xscreensaver", "gnome-screensaver", "cinnamon-screensaver", "mate-screensaver", "xfce4-screensaver",
        "kde", "kscreenlocker", "swaylock", "i3lock", "light-locker", "slock", "xsecurelock",
    ]

    public init() {}

    public struct Error: Swift.Error, CustomStringConvertible, Equatable {
        public let description: String
        init(_ d: String) { description = d }
    }

    public static func load(path: String) throws -> DaemonConfig {
        guard FileManager.default.fileExists(atPath: path) else { return DaemonConfig() }
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw Error("\(path): cannot read the file")
        }
        return try parse(text, source: path)
    }

    /// Parses and validates; unknown sections and keys are errors, so a typo never silently
    /// falls back to a default.
    public static func parse(_ text: String, source: String = "config") throws -> DaemonConfig {
        try checkLines(text, source: source)
        let table: TOMLTable
        do { table = try TOMLTable(string: text) } catch {
            throw Error("\(source): not valid TOML: \(error)")
        }
        var c = DaemonConfig()
        var reader = Reader(source: source)
        try reader.sections(table, allowed: ["box", "radio", "sessions", "limits", "presence", "pam", "enrolment", "unlock"])
        if let t = try reader.section(table, "unlock", keys: ["logind_unlock"]) {
            if let v = t["logind_unlock"] {
                guard let b = v.bool else { throw Error("\(source): [unlock] logind_unlock must be true or false") }
                c.logindUnlock = b
            }
        }
        if let t = try reader.section(table, "box", keys: ["id", "state_directory"]) {
            if let id = try reader.string(t, "box", "id") {
                guard let boxID = BoxID(id) else { throw Error("\(source): [box] id must be four digits, got \"\(id)\"") }
                c.boxID = boxID
            }
            c.stateDirectory = try reader.string(t, "box", "state_directory") ?? c.stateDirectory
        }
        if let t = try reader.section(table, "radio", keys: ["backend", "adapter", "advertising_interval_ms", "nonce_rotation_s", "sim_directory", "sim_position"]) {
            if let b = try reader.string(t, "radio", "backend") {
                guard let backend = RadioBackend(rawValue: b) else { throw Error("\(source): [radio] backend must be auto, simulated or bluez") }
                c.radio = backend
            }
            c.adapter = try reader.string(t, "radio", "adapter") ?? c.adapter
            c.advertisingInterval = try reader.milliseconds(t, "radio", "advertising_interval_ms", 20...10_240) ?? c.advertisingInterval
            c.nonceRotation = try reader.seconds(t, "radio", "nonce_rotation_s", 5...3600) ?? c.nonceRotation
            c.simDirectory = try reader.string(t, "radio", "sim_directory") ?? c.simDirectory
            c.simPosition = try reader.double(t, "radio", "sim_position") ?? c.simPosition
        }
        if let t = try reader.section(table, "sessions", keys: ["handshake_timeout_s", "command_timeout_s", "outcome_timeout_s", "max_connections"]) {
            c.handshakeTimeout = try reader.seconds(t, "sessions", "handshake_timeout_s", 1...60) ?? c.handshakeTimeout
            c.commandTimeout = try reader.seconds(t, "sessions", "command_timeout_s", 1...120) ?? c.commandTimeout
            c.outcomeTimeout = try reader.seconds(t, "sessions", "outcome_timeout_s", 5...600) ?? c.outcomeTimeout
            c.maxConnections = try reader.int(t, "sessions", "max_connections", 1...32) ?? c.maxConnections
        }
        if let t = try reader.section(table, "limits", keys: ["failed_handshakes_per_minute", "rejected_pushes_per_phone", "rejected_pushes_per_user", "rejection_window_s"]) {
            c.failedHandshakesPerMinute = try reader.int(t, "limits", "failed_handshakes_per_minute", 1...10_000) ?? c.failedHandshakesPerMinute
            c.rejectedPushesPerPhone = try reader.int(t, "limits", "rejected_pushes_per_phone", 1...1000) ?? c.rejectedPushesPerPhone
            c.rejectedPushesPerUser = try reader.int(t, "limits", "rejected_pushes_per_user", 1...10_000) ?? c.rejectedPushesPerUser
            c.rejectionWindow = try reader.seconds(t, "limits", "rejection_window_s", 10...86_400) ?? c.rejectionWindow
        }
        if let t = try reader.section(table, "enrolment", keys: ["code_lifetime_s", "code_tries", "pending_s"]) {
            c.pairingCodeLifetime = try reader.seconds(t, "enrolment", "code_lifetime_s", 30...600) ?? c.pairingCodeLifetime
            c.pairingCodeTries = try reader.int(t, "enrolment", "code_tries", 1...10) ?? c.pairingCodeTries
            c.pendingEnrolment = try reader.seconds(t, "enrolment", "pending_s", 30...3600) ?? c.pendingEnrolment
        }
        if let t = try reader.section(table, "presence", keys: ["policy", "grace_s", "rssi_lock_dbm", "rssi_return_dbm", "rssi_samples", "rssi_interval_ms", "away_after_s", "keepalive_timeout_s"]) {
            if let p = try reader.string(t, "presence", "policy") {
                guard let policy = Policy(rawValue: p) else { throw Error("\(source): [presence] policy must be lock, logout or none") }
                c.policy = policy
            }
            c.grace = try reader.milliseconds(t, "presence", "grace_s", 0...3_600_000, scale: 1000) ?? c.grace
            c.rssiLockThreshold = try reader.int(t, "presence", "rssi_lock_dbm", -120...0) ?? c.rssiLockThreshold
            c.rssiReturnThreshold = try reader.int(t, "presence", "rssi_return_dbm", -120...0) ?? c.rssiReturnThreshold
            c.rssiSamples = try reader.int(t, "presence", "rssi_samples", 1...100) ?? c.rssiSamples
            c.rssiInterval = try reader.milliseconds(t, "presence", "rssi_interval_ms", 100...60_000) ?? c.rssiInterval
            c.awayAfter = try reader.milliseconds(t, "presence", "away_after_s", 0...3_600_000, scale: 1000) ?? c.awayAfter
            // More than one keepalive interval (2 s), so a single late keepalive is not a walk-away.
            c.keepaliveTimeout = try reader.seconds(t, "presence", "keepalive_timeout_s", 3...600) ?? c.keepaliveTimeout
            guard c.rssiReturnThreshold > c.rssiLockThreshold else {
                throw Error("\(source): [presence] rssi_return_dbm must be above rssi_lock_dbm (hysteresis)")
            }
        }
        if let t = try reader.section(table, "pam", keys: ["socket", "allowed_uids", "max_wait_s", "services", "verify_service"]) {
            c.verifyService = try reader.string(t, "pam", "verify_service") ?? c.verifyService
            if let list = t["services"] {
                guard let array = list.array, let names = Optional(array.compactMap(\.string)), names.count == array.count else {
                    throw Error("\(source): [pam] services must be a list of PAM service names")
                }
                c.phoneLoginServices = Set(names)
            }
            c.pamSocket = try reader.string(t, "pam", "socket") ?? c.pamSocket
            if let uids = t["allowed_uids"] {
                guard let array = uids.array else { throw Error("\(source): [pam] allowed_uids must be an array of numbers") }
                c.pamAllowedUIDs = try array.map { v in
                    // A uid is 32 bits, and (uid_t)-1 means "no user" to the kernel.
                    guard let n = v.int, let uid = UInt32(exactly: n), uid != UInt32.max else {
                        throw Error("\(source): [pam] allowed_uids must be an array of user IDs (0 to 4294967294)")
                    }
                    return uid
                }
            }
            c.maxPromptWait = try reader.seconds(t, "pam", "max_wait_s", 5...3600) ?? c.maxPromptWait
        }
        return c
    }

    /// The file is the flat subset of TOML that boxkeyd uses: `[section]`, `key = value` where
    /// the value is a string without escapes, a number, true/false or a list of whole numbers,
    /// and comments. Every line must fit before TOMLKit sees the text: its bundled toml++ aborts
    /// the process on some malformed input (`Fuzz/regressions/`), and a config error must be
    /// an error message, not a crash.
    static func checkLines(_ text: String, source: String) throws {
        // No control characters but tab and line ends: a lone CR would hide line breaks from
        // this check while the TOML parser sees them.
        for scalar in text.unicodeScalars where (scalar.value < 0x20 && scalar != "\t" && scalar != "\n" && scalar != "\r") || scalar.value == 0x7f {
            throw Error("\(source): control character U+\(String(scalar.value, radix: 16, uppercase: true)) in the file")
        }
        // "\r\n" is one Character in Swift: split at it as well as at "\n".
        for (number, raw) in text.split(omittingEmptySubsequences: false, whereSeparator: { $0 == "\n" || $0 == "\r\n" }).enumerated() {
            if raw.contains("\r") { throw Error("\(source) line \(number + 1): a carriage return without a line feed") }
            var line = Substring(raw)
            line = line.drop { $0 == " " || $0 == "\t" }
            while let last = line.last, last == " " || last == "\t" { line = line.dropLast() }
            guard !line.isEmpty, line.first != "#" else { continue }
            guard isFlatTOML(line) else {
                throw Error("\(source) line \(number + 1): not understood: \(String(line.prefix(60)))")
            }
        }
    }

    private static func isFlatTOML(_ line: Substring) -> Bool {
        func isName(_ s: Substring) -> Bool { !s.isEmpty && s.allSatisfy { $0 == "_" || ($0.isASCII && ($0.isLowercase || $0.isNumber)) } }
        func trimmed(_ s: Substring) -> Substring {
            var t = s.drop { $0 == " " || $0 == "\t" }
            while let last = t.last, last == " " || last == "\t" { t = t.dropLast() }
            return t
        }
        // A comment may end any line; no value of ours contains '#'.
        let body = trimmed(line.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first ?? "")
        if body.first == "[" {
            return body.last == "]" && isName(body.dropFirst().dropLast())
        }
        guard let equals = body.firstIndex(of: "=") else { return false }
        guard isName(trimmed(body[..<equals])) else { return false }
        let value = trimmed(body[body.index(after: equals)...])
        func isNumber(_ v: Substring) -> Bool {
            let digits = v.hasPrefix("-") ? v.dropFirst() : v
            let parts = digits.split(separator: ".", omittingEmptySubsequences: false)
            return (1...2).contains(parts.count) && parts.allSatisfy { !$0.isEmpty && $0.allSatisfy { $0.isASCII && $0.isNumber } }
        }
        if value.hasPrefix("\"") {
            let inner = value.dropFirst()
            guard inner.last == "\"" else { return false }
            return inner.dropLast().allSatisfy { $0 != "\"" && $0 != "\\" && !($0.asciiValue.map { $0 < 0x20 || $0 == 0x7f } ?? false) }
        }
        if value == "true" || value == "false" { return true }
        if value.hasPrefix("[") {
            guard value.last == "]" else { return false }
            let items = value.dropFirst().dropLast().split(separator: ",", omittingEmptySubsequences: false).map(trimmed)
            // A list of whole numbers, or of plain strings (names: letters, digits, - _ . @).
            func isPlainString(_ v: Substring) -> Bool {
                v.count >= 2 && v.first == "\"" && v.last == "\"" && v.dropFirst().dropLast().allSatisfy {
                    $0.isASCII && ($0.isLetter || $0.isNumber || "-_.@".contains($0))
                }
            }
            return items == [""] || items.allSatisfy { !$0.isEmpty && $0.allSatisfy { $0.isASCII && $0.isNumber } }
                || items.allSatisfy(isPlainString)
        }
        return isNumber(value)
    }

    private struct Reader {
        let source: String
        func sections(_ table: TOMLTable, allowed: Set<String>) throws {
            for key in table.keys where !allowed.contains(key) {
                throw Error("\(source): unknown section [\(key)]")
            }
        }
        func section(_ table: TOMLTable, _ name: String, keys: Set<String>) throws -> TOMLTable? {
            guard let v = table[name] else { return nil }
            guard let t = v.table else { throw Error("\(source): [\(name)] must be a table") }
            for key in t.keys where !keys.contains(key) { throw Error("\(source): unknown key \(key) in [\(name)]") }
            return t
        }
        func string(_ t: TOMLTable, _ s: String, _ k: String) throws -> String? {
            guard let v = t[k] else { return nil }
            guard let x = v.string else { throw Error("\(source): [\(s)] \(k) must be a string") }
            return x
        }
        func int(_ t: TOMLTable, _ s: String, _ k: String, _ range: ClosedRange<Int>) throws -> Int? {
            guard let v = t[k] else { return nil }
            guard let x = v.int, range.contains(x) else { throw Error("\(source): [\(s)] \(k) must be a whole number in \(range.lowerBound)...\(range.upperBound)") }
            return x
        }
        func double(_ t: TOMLTable, _ s: String, _ k: String) throws -> Double? {
            guard let v = t[k] else { return nil }
            if let d = v.double { return d }
            if let i = v.int { return Double(i) }
            throw Error("\(source): [\(s)] \(k) must be a number")
        }
        func seconds(_ t: TOMLTable, _ s: String, _ k: String, _ range: ClosedRange<Int>) throws -> Duration? {
            try int(t, s, k, range).map { .seconds($0) }
        }
        /// A whole number of milliseconds, or of seconds with `scale: 1000` (fractions allowed).
        func milliseconds(_ t: TOMLTable, _ s: String, _ k: String, _ range: ClosedRange<Int>, scale: Double = 1) throws -> Duration? {
            guard let v = try double(t, s, k) else { return nil }
            // Check in Double first: converting a huge value to Int would trap.
            let scaled = (v * scale).rounded()
            guard scaled.isFinite, scaled >= Double(range.lowerBound), scaled <= Double(range.upperBound) else {
                throw Error("\(source): [\(s)] \(k) is out of range")
            }
            return .milliseconds(Int(scaled))
        }
    }
}
