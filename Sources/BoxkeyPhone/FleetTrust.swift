import BoxkeyCore
import BoxkeyHost
import FoundationEssentials

/// The fleet keys this phone trusts (`fleet.json`), and the newest revocation list it has seen
/// under each: a box certified by one of them is taken without pairing, as long as it serves a
/// current list no older than that (docs/fleet.md). Trusting a fleet key is trusting its
/// holder with every box it certifies: add one only from the fleet's admin, by a path you trust.
public struct FleetTrust: Sendable {
    struct File: Codable {
        var keys: [String] = []
        /// Fleet key (hex) → the highest revocation list number seen.
        var newestLists: [String: UInt64] = [:]
    }

    private var file = File()
    let path: String

    public static func load(_ dirs: PhoneDirectories) throws -> FleetTrust {
        var t = FleetTrust(path: dirs.config + "/fleet.json")
        if let bytes = try PrivateFiles.read(t.path) {
            do { t.file = try JSONDecoder().decode(File.self, from: Data(bytes)) } catch {
                throw PhoneError("\(t.path) is corrupt (\(error)); fix or delete it and trust the fleet key again")
            }
        }
        return t
    }

    init(path: String) { self.path = path }

    public var keys: [Ed25519.PublicKey] { file.keys.compactMap { unhex($0).flatMap { try? Ed25519.PublicKey($0) } } }

    public func newestList(_ key: Ed25519.PublicKey) -> UInt64 { file.newestLists[hex(key.bytes)] ?? 0 }

    public mutating func trust(_ key: Ed25519.PublicKey) throws {
        guard !file.keys.contains(hex(key.bytes)) else { return }
        file.keys.append(hex(key.bytes))
        try save()
    }

    /// Forgets the key whose fingerprint starts with `prefix`; returns it.
    public mutating func forget(_ prefix: String) throws -> Ed25519.PublicKey? {
        let matching = keys.filter { Fingerprint.matches($0.fingerprint, prefix: prefix) }
        guard matching.count == 1 else { return nil }
        file.keys.removeAll { $0 == hex(matching[0].bytes) }
        file.newestLists[hex(matching[0].bytes)] = nil
        try save()
        return matching[0]
    }

    /// Remembers a list seen at a box (only ever forward), in the file as it is now: another
    /// process (the agent, `boxkey fleet forget`) may have changed it since this one read it.
    /// Only a key still trusted there gets its number moved.
    public static func saw(_ list: BoxRevocationList, under key: Ed25519.PublicKey, dirs: PhoneDirectories) throws {
        var current = try load(dirs)
        guard current.file.keys.contains(hex(key.bytes)), list.number > current.newestList(key) else { return }
        current.file.newestLists[hex(key.bytes)] = list.number
        try current.save()
    }

    func save() throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try PrivateFiles.write(try encoder.encode(file), to: path)
    }
}
