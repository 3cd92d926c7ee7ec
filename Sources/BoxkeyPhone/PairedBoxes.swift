import BoxkeyCore
import BoxkeyHost
import BoxkeyRadio
import FoundationEssentials

/// Boxes this phone has paired with (`boxes.json`): the pinned key per box ID, and where and
/// when the box was last heard, so the next connection can skip the scan (`BoxFinder`).
public struct PairedBoxes: Sendable {
    public struct Box: Codable, Sendable, Equatable {
        public var id: String
        public var key: String
        public var fingerprint: String
        public var address: String?
        public var pairedAt: Date
        /// The last advertisement heard from the box (its 6-byte payload, hex) and when.
        public var lastAdvertisement: String?
        public var heardAt: Date?
        /// Taken on a fleet certificate, not paired: its certificate and the fleet's revocation
        /// list are checked again at every connection, and it is never used as a paired box.
        public var viaFleet: Bool?
        /// The fleet key (hex) that certified it: forgetting that key forgets the box.
        public var fleetKey: String?
    }
    struct File: Codable {
        var boxes: [Box] = []
        var defaultBox: String?
    }

    private var file = File()
    let path: String

    /// `makingFolders: false` reads only (doctor).
    public static func load(_ dirs: PhoneDirectories, makingFolders: Bool = true) throws -> PairedBoxes {
        if makingFolders { try dirs.ensure() }
        var b = PairedBoxes(path: dirs.config + "/boxes.json")
        if let bytes = try PrivateFiles.read(b.path) {
            let data = Data(bytes)
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .iso8601
            do { b.file = try decoder.decode(File.self, from: data) } catch {
                throw PhoneError("\(b.path) is corrupt (\(error)); fix or delete it and pair again")
            }
        }
        return b
    }

    init(path: String) { self.path = path }

    public var boxes: [Box] { file.boxes }
    public var defaultBox: BoxID? { file.defaultBox.flatMap(BoxID.init) ?? (file.boxes.count == 1 ? BoxID(file.boxes[0].id) : nil) }

    public func box(_ id: BoxID) -> Box? { file.boxes.first { $0.id == id.description } }

    public func key(of id: BoxID) -> PublicKey? {
        box(id).flatMap { unhex($0.key) }.flatMap { try? PublicKey($0) }
    }

    /// Where the box was last heard and its advertisement then, if both are on record.
    public func lastHeard(_ id: BoxID) -> (box: HeardBox, at: Date)? {
        guard let b = box(id), let address = b.address.flatMap(DeviceAddress.init), let at = b.heardAt,
              let payload = b.lastAdvertisement.flatMap(unhex), let advert = try? Advertisement.decode(payload) else { return nil }
        return (HeardBox(address: address, advertisement: advert, rssi: nil), at)
    }

    public mutating func pin(_ id: BoxID, key: PublicKey, address: DeviceAddress?, fleetKey: Ed25519.PublicKey? = nil) throws {
        if let fleetKey, let b = box(id), b.viaFleet == true, b.key == hex(key.bytes), b.fleetKey == hex(fleetKey.bytes) { return }
        file.boxes.removeAll { $0.id == id.description }
        file.boxes.append(Box(id: id.description, key: hex(key.bytes), fingerprint: key.fingerprint, address: address?.string, pairedAt: Date(),
                              viaFleet: fleetKey == nil ? nil : true, fleetKey: fleetKey.map { hex($0.bytes) }))
        file.defaultBox = id.description
        try save()
    }

    /// Records where and when a box was heard (written only when the advertisement changed).
    public mutating func remember(_ id: BoxID, heard: HeardBox, at now: Date = Date()) throws {
        guard let i = file.boxes.firstIndex(where: { $0.id == id.description }) else { return }
        let advert = hex(heard.advertisement.encode())
        guard file.boxes[i].address != heard.address.string || file.boxes[i].lastAdvertisement != advert else { return }
        file.boxes[i].address = heard.address.string
        file.boxes[i].lastAdvertisement = advert
        file.boxes[i].heardAt = now
        try save()
    }

    /// Forgets every box taken on `fleetKey`'s certificates; returns their IDs.
    public mutating func forgetBoxes(certifiedBy fleetKey: Ed25519.PublicKey) throws -> [String] {
        let gone = file.boxes.filter { $0.viaFleet == true && ($0.fleetKey == nil || $0.fleetKey == hex(fleetKey.bytes)) }.map(\.id)
        guard !gone.isEmpty else { return [] }
        file.boxes.removeAll { gone.contains($0.id) }
        if let d = file.defaultBox, gone.contains(d) { file.defaultBox = nil }
        try save()
        return gone
    }

    @discardableResult
    public mutating func forget(_ id: BoxID) throws -> Bool {
        let before = file.boxes.count
        file.boxes.removeAll { $0.id == id.description }
        if file.defaultBox == id.description { file.defaultBox = nil }
        try save()
        return file.boxes.count != before
    }

    func save() throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try PrivateFiles.write(try encoder.encode(file), to: path)
    }
}
