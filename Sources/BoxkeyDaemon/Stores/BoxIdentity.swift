import BoxkeyCore
import BoxkeyHost
import FoundationEssentials

/// The box's static key pair and four-digit ID, kept in `<state>/identity` (0600, in a 0700
/// directory). Created on first start; afterwards any problem with the file stops the daemon
/// with a clear message: regenerating silently would break every phone's pinned key.
public struct BoxIdentity: Sendable {
    public let boxID: BoxID
    public let keyPair: KeyPair

    public var fingerprint: String { keyPair.publicKey.fingerprint }

    public struct Error: Swift.Error, CustomStringConvertible {
        public let description: String
    }

    static let header = "boxkey-identity 1"

    /// Loads the identity, or creates it if the file does not exist. `configuredID` overrides
    /// the stored ID (an admin may renumber a box); `avoid` lists IDs heard nearby.
    public static func loadOrCreate(directory: String, configuredID: BoxID?, avoid: Set<BoxID> = []) throws -> BoxIdentity {
        try PrivateFiles.ensureOwnDirectory(directory)
        let path = directory + "/identity"
        if let identity = try loadIfPresent(path: path) {
            if let configuredID, configuredID != identity.boxID {
                let renumbered = BoxIdentity(boxID: configuredID, keyPair: identity.keyPair)
                try renumbered.save(path: path)
                return renumbered
            }
            return identity
        }
        let id = configuredID ?? randomID(avoiding: avoid)
        let identity = BoxIdentity(boxID: id, keyPair: KeyPair.generate())
        try identity.save(path: path)
        return identity
    }

    static func randomID(avoiding avoid: Set<BoxID>) -> BoxID {
        while true {
            // 1000...9999: no leading zero, so the ID reads the same everywhere.
            let id = BoxID(UInt16(1000 + SystemRandom.uniform(9000)))!
            if !avoid.contains(id) { return id }
        }
    }

    public static func load(path: String) throws -> BoxIdentity {
        guard let identity = try loadIfPresent(path: path) else { throw Error(description: "\(path): no such file") }
        return identity
    }

    /// The identity in `path`, nil when there is none. The file must be the daemon's own and
    /// private (`PrivateFiles.readOwn`): a key another account could have read or replaced is
    /// never used, and never silently replaced either.
    public static func loadIfPresent(path: String) throws -> BoxIdentity? {
        let bytes: [UInt8]?
        do { bytes = try PrivateFiles.readOwn(path, secret: true) } catch { throw Error(description: "\(error)") }
        guard var data = bytes else { return nil }
        defer { secureZero(&data) }
        guard var text = String(validating: data, as: UTF8.self) else {
            throw Error(description: "\(path) is not text; restore it from backup (phones have pinned this box's key, so boxkeyd will not make a new one)")
        }
        defer { text = String(repeating: " ", count: text.count) }
        let lines = text.split(separator: "\n").map(String.init)
        func corrupt(_ why: String) -> Error {
            Error(description: "\(path) is corrupt (\(why)); restore it from backup, or delete it to create a new identity — every paired phone will then have to pair again")
        }
        guard lines.count == 4, lines[0] == header else { throw corrupt("bad header") }
        guard lines[1].hasPrefix("box-id "), let id = BoxID(String(lines[1].dropFirst(7))) else { throw corrupt("bad box-id line") }
        guard lines[2].hasPrefix("private-key "), var key = unhex(String(lines[2].dropFirst(12))), key.count == 32 else { throw corrupt("bad private-key line") }
        defer { secureZero(&key) }
        guard lines[3] == "check " + checksum(lines[0...2].joined(separator: "\n")) else { throw corrupt("checksum mismatch") }
        let pair = try KeyPair(privateKey: SecureBytes(copying: key))
        return BoxIdentity(boxID: id, keyPair: pair)
    }

    func save(path: String) throws {
        var body = [Self.header, "box-id \(boxID)", "private-key " + hex(keyPair.privateKey.unprotectedCopy)].joined(separator: "\n")
        body += "\ncheck " + checksum(body) + "\n"
        try PrivateFiles.write(Data(body.utf8), to: path)
    }

    static func checksum(_ s: String) -> String { hex(Blake2b.hash(Array(s.utf8), outputLength: 8)) }
    func checksum(_ s: String) -> String { Self.checksum(s) }
}
