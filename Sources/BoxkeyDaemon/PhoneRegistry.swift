import BoxkeyCore
import Foundation

/// The phones this box knows: recorded at each phone's first successful login, with the user
/// and the name the phone gave; revocation keeps the record (the audit trail) and refuses the key.
/// Stored in `<state>/phones.json` (0600).
public struct PhoneRegistry: Sendable {
    public struct Phone: Codable, Sendable, Equatable {
        public var key: String
        public var fingerprint: String
        public var name: String
        public var user: String
        public var firstLogin: Date
        public var lastLogin: Date
        public var revokedAt: Date?
        public var revoked: Bool { revokedAt != nil }
    }

    public private(set) var phones: [Phone] = []
    let path: String

    public static func load(directory: String) throws -> PhoneRegistry {
        let path = directory + "/phones.json"
        var registry = PhoneRegistry(path: path)
        guard FileManager.default.fileExists(atPath: path) else { return registry }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw BoxIdentity.Error(description: "\(path) exists but cannot be read")
        }
        do {
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .iso8601
            registry.phones = try decoder.decode([Phone].self, from: data)
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

    /// Records a successful login; returns true when this is the phone's first.
    public mutating func recordLogin(_ key: PublicKey, user: String, name: String, at date: Date = Date()) throws -> Bool {
        let k = hex(key.bytes)
        var first = false
        if let i = phones.firstIndex(where: { $0.key == k }) {
            phones[i].lastLogin = date
            phones[i].user = user
            if !name.isEmpty { phones[i].name = name }
        } else {
            phones.append(Phone(key: k, fingerprint: key.fingerprint, name: name, user: user, firstLogin: date, lastLogin: date))
            first = true
        }
        try save()
        return first
    }

    /// Revokes the phone whose fingerprint (or a unique prefix of it, case-insensitive) matches.
    public mutating func revoke(fingerprint: String, at date: Date = Date()) throws -> Phone {
        let wanted = fingerprint.uppercased()
        let matches = phones.indices.filter { phones[$0].fingerprint.hasPrefix(wanted) || phones[$0].fingerprint.replacingOccurrences(of: "-", with: "").hasPrefix(wanted) }
        guard !wanted.isEmpty, matches.count == 1 else {
            throw BoxIdentity.Error(description: matches.isEmpty ? "no phone with fingerprint \(fingerprint)" : "\(fingerprint) matches \(matches.count) phones; give more of the fingerprint")
        }
        phones[matches[0]].revokedAt = phones[matches[0]].revokedAt ?? date
        try save()
        return phones[matches[0]]
    }

    func save() throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try writePrivateFile(path: path, contents: try encoder.encode(phones))
    }
}
