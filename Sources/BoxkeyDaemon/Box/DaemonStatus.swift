import BoxkeyCore
import FoundationEssentials

/// What `boxkeyd status` shows, as the daemon sends it over its admin socket (JSON): the CLI
/// prints it for people, or as it is with `--json`.
public struct DaemonStatus: Codable, Sendable, Equatable {
    public struct Pairing: Codable, Sendable, Equatable {
        /// Whether a pairing code is live now; its seconds and tries left when it is.
        public var live: Bool
        public var expiresInSeconds: Int?
        public var triesLeft: Int?
        /// Phones paired and waiting for their first accepted login.
        public var pendingPhones: Int
    }
    public struct Session: Codable, Sendable, Equatable {
        public var id: String
        public var user: String
        public var place: String
    }
    public struct Presence: Codable, Sendable, Equatable {
        public var user: String
        public var phone: String
    }

    public var version: String
    public var boxID: String
    public var fingerprint: String
    public var publicKey: String
    public var radio: String
    public var connections: Int
    public var prompts: [String]
    public var pairing: Pairing
    public var sessions: [Session]
    public var presence: [Presence]
    /// Users whose walk-away grace period runs now.
    public var grace: [String]
    public var enrolledPhones: Int
    public var revokedPhones: Int
    public struct LoginModes: Codable, Sendable, Equatable {
        /// The box's mode (`[login] mode`): "password" or "key".
        public var mode: String
        /// Users in key (escrow) mode whatever the box's mode is.
        public var keyUsers: [String]
        public var escrowUsers: [String]
        /// Escrow mode: the sealed passwords the box keeps (each opens only with its phone).
        public var sealedPasswords: Int
        /// `[login] proximity`: near phones may offer a login, completed by Enter at the prompt.
        public var proximity: Bool
        /// Services where a key login may succeed.
        public var keyServices: [String]
    }
    public var login: LoginModes
    /// `[fleet]`: the directory, what the box last read of it, and whether that is still used.
    public struct Fleet: Codable, Sendable, Equatable {
        public var uri: String
        public var phones: Int
        public var lastReadAgeSeconds: Int?
        /// Whether fleet phones are taken now (the last read is within max_stale_s).
        public var fresh: Bool
        public var maxStaleSeconds: Int
        public var error: String?
        public var publish: Bool
        public struct Certificate: Codable, Sendable, Equatable {
            public var serial: String
            public var notAfter: Date
        }
        /// This box's fleet certificate, and what is wrong with it or the revocation list.
        public var certificate: Certificate?
        public var certificateProblem: String?
        /// How the box reads the directory now: following its changes (RFC 4533), or reading
        /// it whole every refresh_s, and why.
        public var mode: String?
    }
    public var fleet: Fleet?
    /// What the last reload did; absent before the first one.
    public var lastReload: String?

    /// For people: one line per field, "none" where a list is empty, phone-supplied text escaped.
    public var text: String {
        func list(_ items: [String]) -> String { items.isEmpty ? "none" : items.map(logSafe).joined(separator: ", ") }
        let code = pairing.live
            ? "a code is live for \(pairing.expiresInSeconds ?? 0) s, \(pairing.triesLeft ?? 0) tries left"
            : "no live code"
        var lines = [
            "box ID:      \(boxID)",
            "key:         \(fingerprint)",
            "public key:  \(publicKey)",
            "version:     \(version)",
            "radio:       \(radio)",
            "connections: \(connections)",
            "prompts:     \(list(prompts))",
            "pairing:     \(code), \(pairing.pendingPhones) phone(s) pending",
            "sessions:    \(list(sessions.map { "\($0.id) (\($0.user), \($0.place))" }))",
            "presence:    \(list(presence.map { "\($0.user) (phone \($0.phone))" }))",
            "phones:      \(enrolledPhones) enrolled, \(revokedPhones) revoked",
            "login mode:  \(login.mode)\(login.keyUsers.isEmpty || login.mode == "key" ? "" : "; key mode for \(list(login.keyUsers))")\(login.escrowUsers.isEmpty || login.mode == "escrow" ? "" : "; escrow mode for \(list(login.escrowUsers))")",
        ]
        if login.mode == "key" || !login.keyUsers.isEmpty { lines.append("key logins:  in \(list(login.keyServices))") }
        if login.proximity { lines.append("proximity:   on (a near phone offers; Enter at the prompt logs in)") }
        if login.mode == "escrow" || !login.escrowUsers.isEmpty || login.sealedPasswords > 0 {
            lines.append("escrow:      \(login.sealedPasswords) sealed password(s)")
        }
        if let fleet {
            let read = fleet.lastReadAgeSeconds.map { "read \($0) s ago" } ?? "never read"
            let state = fleet.fresh ? "\(fleet.phones) phone(s) taken" : "fleet phones REFUSED (no read within \(fleet.maxStaleSeconds) s)"
            lines.append("fleet:       \(fleet.uri): \(read); \(state)\(fleet.publish ? "; publishes enrolments" : "")\(fleet.error.map { "; last error: \($0)" } ?? "")")
            if let mode = fleet.mode { lines.append("             \(mode)") }
            if let c = fleet.certificate {
                lines.append("certificate: \(c.serial), valid until \(c.notAfter.ISO8601Format())\(fleet.certificateProblem.map { "; PROBLEM: \($0)" } ?? "")")
            }
        }
        if !grace.isEmpty { lines.append("grace:       \(list(grace))") }
        if let lastReload { lines.append("reload:      \(logSafe(lastReload))") }
        return lines.joined(separator: "\n")
    }
}

extension PhoneRegistry {
    /// `boxkeyd phones list` for people; JSON is the records themselves.
    public static func text(_ phones: [Phone]) -> String {
        if phones.isEmpty { return "no phones are enrolled at this box" }
        func stamp(_ d: Date) -> String { d.ISO8601Format() }
        return phones.map { p in
            let users = p.enrolledBy == nil ? "(not enrolled: version-1 record)" : p.users.map(logSafe).joined(separator: ",")
            return "\(p.fingerprint)  \(users)  \(p.name.isEmpty ? "-" : logSafe(p.name))  by \(p.enrolledBy ?? "-")  enrolled \(p.enrolledAt.map(stamp) ?? "-")  last \(p.lastLogin.map(stamp) ?? "-")\(p.revokedAt.map { "  REVOKED \(stamp($0))" } ?? "")"
        }.joined(separator: "\n")
    }
}

/// The admin socket's JSON: sorted keys, ISO 8601 dates.
public enum AdminJSON {
    public static func encode(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        return (try? encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    public static func decode<T: Decodable>(_ type: T.Type, _ text: String) throws -> T {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return try decoder.decode(type, from: Data(text.utf8))
    }
}
