import BoxkeyCore
import BoxkeyHost
import FoundationEssentials

/// The phones enrolled at this box, each for the users it may push for: enrolled by a pairing
/// code shown at the box (then the user of its first accepted login) or by an administrator.
/// Revocation keeps the record (the audit trail) and refuses the key. Stored in
/// `<state>/phones.json` (0600). Records from protocol version 1 (trust on first use) carry no
/// `enrolledBy` and are not honoured: those phones pair again.
public struct PhoneRegistry: Sendable {
    public struct Phone: Codable, Sendable, Equatable {
        public var key: String
        public var fingerprint: String
        public var name: String
        /// The users this phone may push for.
        public var users: [String]
        /// "pairing code" or "admin"; nil for version-1 records, which are not honoured.
        public var enrolledBy: String?
        public var enrolledAt: Date?
        public var lastLogin: Date?
        public var revokedAt: Date?
        public var revoked: Bool { revokedAt != nil }
        public var enrolled: Bool { enrolledBy != nil && !revoked && !users.isEmpty }

        init(key: String, fingerprint: String, name: String, users: [String], enrolledBy: String?, enrolledAt: Date?) {
            self.key = key; self.fingerprint = fingerprint; self.name = name; self.users = users
            self.enrolledBy = enrolledBy; self.enrolledAt = enrolledAt
        }

        // Version-1 files have `user` and no `users`: they load (keeping revocations) unenrolled.
        public init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            key = try c.decode(String.self, forKey: .key)
            fingerprint = try c.decode(String.self, forKey: .fingerprint)
            name = try c.decodeIfPresent(String.self, forKey: .name) ?? ""
            users = try c.decodeIfPresent([String].self, forKey: .users) ?? []
            enrolledBy = try c.decodeIfPresent(String.self, forKey: .enrolledBy)
            enrolledAt = try c.decodeIfPresent(Date.self, forKey: .enrolledAt)
            lastLogin = try c.decodeIfPresent(Date.self, forKey: .lastLogin)
            revokedAt = try c.decodeIfPresent(Date.self, forKey: .revokedAt)
        }
    }

    public private(set) var phones: [Phone] = []
    let path: String

    public static func load(directory: String) throws -> PhoneRegistry {
        let path = directory + "/phones.json"
        var registry = PhoneRegistry(path: path)
        // Who may log in as whom: only a file the daemon alone could have written is believed.
        let bytes: [UInt8]?
        do { bytes = try PrivateFiles.readOwn(path) } catch { throw BoxIdentity.Error(description: "\(error)") }
        guard let bytes else { return registry }
        do {
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .iso8601
            registry.phones = try decoder.decode([Phone].self, from: Data(bytes))
        } catch {
            throw BoxIdentity.Error(description: "\(path) is corrupt (\(error)); restore it from backup — it records which phones are revoked")
        }
        return registry
    }

    init(path: String) { self.path = path }

    public func phone(_ key: PublicKey) -> Phone? {
        let k = hex(key.bytes)
        return phones.first { $0.key == k }
    }

    public func isRevoked(_ key: PublicKey) -> Bool { phone(key)?.revoked ?? false }

    /// The users an enrolled, unrevoked phone may push for; empty for any other key.
    public func users(of key: PublicKey) -> [String] {
        guard let p = phone(key), p.enrolled else { return [] }
        return p.users
    }

    /// Enrols `key` for `user` (adding the user to an existing record). A revoked phone stays
    /// revoked: an administrator must remove the record first. Nothing changes unless the file
    /// was written: a phone the box could not record is not enrolled, even until a restart.
    public mutating func enrol(_ key: PublicKey, user: String, name: String, by origin: String, at date: Date = Date()) throws {
        let k = hex(key.bytes)
        var next = phones
        if let i = next.firstIndex(where: { $0.key == k }) {
            guard !next[i].revoked else { throw BoxIdentity.Error(description: "phone \(key.fingerprint) is revoked") }
            if next[i].enrolledBy == nil { next[i].users = [] }
            if !next[i].users.contains(user) { next[i].users.append(user) }
            next[i].enrolledBy = origin
            next[i].enrolledAt = next[i].enrolledAt ?? date
            if !name.isEmpty { next[i].name = name }
        } else {
            next.append(Phone(key: k, fingerprint: key.fingerprint, name: name, users: [user], enrolledBy: origin, enrolledAt: date))
        }
        try save(next)
        phones = next
    }

    /// Records an accepted login of an enrolled phone (once written).
    public mutating func recordLogin(_ key: PublicKey, name: String, at date: Date = Date()) throws {
        guard let i = phones.firstIndex(where: { $0.key == hex(key.bytes) }) else { return }
        var next = phones
        next[i].lastLogin = date
        if !name.isEmpty { next[i].name = name }
        try save(next)
        phones = next
    }

    /// Revokes the phone whose fingerprint (or a unique prefix of it, case-insensitive) matches.
    /// A revocation holds in memory even when the file cannot be written (it fails closed); the
    /// error then says it lasts only until a restart.
    public mutating func revoke(fingerprint: String, at date: Date = Date()) throws -> Phone {
        let matches = phones.indices.filter { Fingerprint.matches(phones[$0].fingerprint, prefix: fingerprint) }
        guard matches.count == 1 else {
            throw BoxIdentity.Error(description: matches.isEmpty ? "no phone with fingerprint \(fingerprint)" : "\(fingerprint) matches \(matches.count) phones; give more of the fingerprint")
        }
        phones[matches[0]].revokedAt = phones[matches[0]].revokedAt ?? date
        try saveRevocation()
        return phones[matches[0]]
    }

    /// Revokes a phone this box has no record of (one it knows from the fleet directory): a
    /// record that is revoked from the start, so the directory cannot bring it back here.
    public mutating func revoke(unknown key: PublicKey, name: String, at date: Date = Date()) throws -> Phone {
        var phone = Phone(key: hex(key.bytes), fingerprint: key.fingerprint, name: name, users: [], enrolledBy: nil, enrolledAt: nil)
        phone.revokedAt = date
        phones.append(phone)
        try saveRevocation()
        return phone
    }

    private func saveRevocation() throws {
        do { try save(phones) } catch {
            throw BoxIdentity.Error(description: "revoked until boxkeyd restarts, but not recorded: \(error); free the disk and revoke it again")
        }
    }

    func save(_ phones: [Phone]) throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try PrivateFiles.write(try encoder.encode(phones), to: path)
    }
}
