import BoxkeyCore
import BoxkeyHost
import FoundationEssentials

/// Escrow mode's sealed passwords, one per enrolled phone and user, in `<state>/escrow.json`
/// (0600). Each opens only with the escrow secret its phone sends at login (`EscrowSeal`);
/// the file alone reveals nothing. Revoking a phone destroys its copies.
public struct EscrowStore: Sendable {
    public struct Record: Codable, Sendable, Equatable {
        public var phone: String      // the phone's fingerprint
        public var user: String
        public var sealed: EscrowSeal.Sealed
        public var sealedAt: Date
    }

    public private(set) var records: [Record] = []
    let path: String

    init(path: String) { self.path = path }

    public static func load(directory: String) throws -> EscrowStore {
        var store = EscrowStore(path: directory + "/escrow.json")
        let bytes: [UInt8]?
        do { bytes = try PrivateFiles.readOwn(store.path, secret: true) } catch { throw BoxIdentity.Error(description: "\(error)") }
        guard let bytes else { return store }
        do {
            store.records = try AdminJSON.decode([Record].self, String(decoding: bytes, as: UTF8.self))
        } catch {
            throw BoxIdentity.Error(description: "\(store.path) is corrupt (\(error)); removing it loses only the sealed copies (each user types the password once more with the phone present)")
        }
        return store
    }

    public func sealed(phone: PublicKey, user: String) -> EscrowSeal.Sealed? {
        records.first { $0.phone == phone.fingerprint && $0.user == user }?.sealed
    }

    /// Keeps a sealed copy, once it is written (a copy the box could not record is not kept).
    public mutating func keep(_ sealed: EscrowSeal.Sealed, phone: PublicKey, user: String, at date: Date = Date()) throws {
        var next = records
        next.removeAll { $0.phone == phone.fingerprint && $0.user == user }
        next.append(Record(phone: phone.fingerprint, user: user, sealed: sealed, sealedAt: date))
        try save(next)
        records = next
    }

    /// Destroys the copies of one phone (all its users, or one). Returns how many went. They go
    /// from memory even when the file cannot be written (it fails closed); the error says so.
    @discardableResult
    public mutating func destroy(phone fingerprint: String, user: String? = nil) throws -> Int {
        let before = records.count
        records.removeAll { $0.phone == fingerprint && (user == nil || $0.user == user) }
        guard records.count != before else { return 0 }
        do { try save(records) } catch {
            throw BoxIdentity.Error(description: "destroyed until boxkeyd restarts, but not recorded: \(error)")
        }
        return before - records.count
    }

    func save(_ records: [Record]) throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try PrivateFiles.write(try encoder.encode(records), to: path)
    }
}
