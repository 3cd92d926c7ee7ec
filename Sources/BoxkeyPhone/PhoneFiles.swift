import BoxkeyCore
import BoxkeyRadio
import Foundation

/// Where the phone keeps its state: `$XDG_CONFIG_HOME/boxkey` (0700: its key, the pinned
/// boxes) and `$XDG_DATA_HOME/boxkey` (0700: the vault, 0600).
public struct PhoneDirectories: Sendable {
    public let config: String
    public let data: String

    public init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        let home = environment["HOME"] ?? NSHomeDirectory()
        config = (environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.config") + "/boxkey"
        data = (environment["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.local/share") + "/boxkey"
    }

    public func ensure() throws {
        for d in [config, data] {
            try FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            chmod(d, 0o700)
        }
    }
}

public struct PhoneError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

/// Writes a 0600 file atomically.
func writePrivate(_ path: String, _ data: Data) throws {
    let temporary = path + ".tmp-\(getpid())"
    guard FileManager.default.createFile(atPath: temporary, contents: data, attributes: [.posixPermissions: 0o600]) else {
        throw PhoneError("cannot write \(path)")
    }
    guard rename(temporary, path) == 0 else { unlink(temporary); throw PhoneError("cannot write \(path)") }
}

/// The phone's static key (`phone.key`, 0600) and its device secret, created on first use.
/// The key identifies the phone to boxes; the device secret binds the vault to this device.
public struct PhoneIdentity: Sendable {
    public let keyPair: KeyPair
    public let deviceSecret: SecureBytes

    public init(keyPair: KeyPair, deviceSecret: SecureBytes) {
        self.keyPair = keyPair
        self.deviceSecret = deviceSecret
    }

    public static func loadOrCreate(_ dirs: PhoneDirectories) throws -> PhoneIdentity {
        try dirs.ensure()
        let path = dirs.config + "/phone.key"
        if let data = FileManager.default.contents(atPath: path) {
            guard data.count == 64 else { throw PhoneError("\(path) is corrupt; delete it to make a new phone identity (boxes will see a new phone)") }
            var bytes = [UInt8](data)
            defer { secureZero(&bytes) }
            return PhoneIdentity(keyPair: try KeyPair(privateKey: SecureBytes(copying: Array(bytes[0..<32]))),
                                 deviceSecret: SecureBytes(copying: Array(bytes[32..<64])))
        }
        let key = SecureBytes.random(count: 32), secret = SecureBytes.random(count: 32)
        var bytes = key.unprotectedCopy + secret.unprotectedCopy
        defer { secureZero(&bytes) }
        try writePrivate(path, Data(bytes))
        return PhoneIdentity(keyPair: try KeyPair(privateKey: key), deviceSecret: secret)
    }

    /// A stable simulated-radio address for this phone.
    public var simulatedAddress: DeviceAddress {
        let h = Blake2b.hash(keyPair.publicKey.bytes, outputLength: 3)
        return DeviceAddress(String(format: "00:50:48:%02X:%02X:%02X", h[0], h[1], h[2]))!
    }
}

/// Boxes this phone has paired with: the pinned key per box ID, and the last address seen.
public struct PairedBoxes: Sendable {
    public struct Box: Codable, Sendable, Equatable {
        public var id: String
        public var key: String
        public var fingerprint: String
        public var address: String?
        public var pairedAt: Date
    }
    struct File: Codable {
        var boxes: [Box] = []
        var defaultBox: String?
    }

    private var file = File()
    let path: String

    public static func load(_ dirs: PhoneDirectories) throws -> PairedBoxes {
        try dirs.ensure()
        var b = PairedBoxes(path: dirs.config + "/boxes.json")
        if let data = FileManager.default.contents(atPath: b.path) {
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

    public mutating func pin(_ id: BoxID, key: PublicKey, address: DeviceAddress?) throws {
        file.boxes.removeAll { $0.id == id.description }
        file.boxes.append(Box(id: id.description, key: hex(key.bytes), fingerprint: key.fingerprint, address: address?.string, pairedAt: Date()))
        file.defaultBox = id.description
        try save()
    }

    public mutating func remember(_ id: BoxID, address: DeviceAddress) throws {
        guard let i = file.boxes.firstIndex(where: { $0.id == id.description }), file.boxes[i].address != address.string else { return }
        file.boxes[i].address = address.string
        try save()
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
        try writePrivate(path, try encoder.encode(file))
    }
}
