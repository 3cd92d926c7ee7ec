/// A Bluetooth device address, "AA:BB:CC:DD:EE:FF" (BlueZ's `Device1.Address` form).
public struct DeviceAddress: Hashable, Sendable, Comparable, CustomStringConvertible, Codable {
    public let string: String

    public init?(_ string: String) {
        let parts = string.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 6, parts.allSatisfy({ $0.count == 2 && $0.allSatisfy(\.isHexDigit) }) else { return nil }
        self.string = string.uppercased()
    }

    public var description: String { string }
    public static func < (a: DeviceAddress, b: DeviceAddress) -> Bool { a.string < b.string }
}

/// GATT characteristic properties (Core spec Vol 3 Part G 3.3.1.1), the subset Boxkey uses;
/// BlueZ calls them "read", "write", "write-without-response", "notify" in `Flags`.
public struct CharacteristicProperties: OptionSet, Sendable, Hashable, Codable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public static let read = CharacteristicProperties(rawValue: 0x02)
    public static let writeWithoutResponse = CharacteristicProperties(rawValue: 0x04)
    public static let write = CharacteristicProperties(rawValue: 0x08)
    public static let notify = CharacteristicProperties(rawValue: 0x10)
}

/// One characteristic of a published service. `value` is served to reads; Boxkey's only
/// readable characteristic is static, which is why reads need no callback into the app.
public struct GATTCharacteristic: Sendable, Hashable, Codable {
    public var uuid: String
    public var properties: CharacteristicProperties
    public var value: [UInt8]?

    public init(uuid: String, properties: CharacteristicProperties, value: [UInt8]? = nil) {
        self.uuid = uuid.lowercased()
        self.properties = properties
        self.value = value
    }
}

public struct GATTService: Sendable, Hashable, Codable {
    public var uuid: String
    public var characteristics: [GATTCharacteristic]

    public init(uuid: String, characteristics: [GATTCharacteristic]) {
        self.uuid = uuid.lowercased()
        self.characteristics = characteristics
    }

    public func characteristic(_ uuid: String) -> GATTCharacteristic? {
        characteristics.first { $0.uuid == uuid.lowercased() }
    }

    public mutating func setValue(_ value: [UInt8], of uuid: String) {
        guard let i = characteristics.firstIndex(where: { $0.uuid == uuid.lowercased() }) else { return }
        characteristics[i].value = value
    }
}

/// What a peripheral advertises, in the terms of BlueZ's `LEAdvertisement1`.
public struct AdvertisingData: Sendable, Hashable, Codable {
    public var serviceUUIDs: [String]
    public var manufacturerData: [UInt16: [UInt8]]
    public var localName: String?
    /// Advertising interval; BlueZ `MinInterval`/`MaxInterval` (experimental before 5.77).
    public var interval: Duration

    public init(serviceUUIDs: [String], manufacturerData: [UInt16: [UInt8]] = [:], localName: String? = nil,
                interval: Duration = .milliseconds(100)) {
        self.serviceUUIDs = serviceUUIDs.map { $0.lowercased() }
        self.manufacturerData = manufacturerData
        self.localName = localName
        self.interval = interval
    }
}

/// BlueZ `Adapter1.SetDiscoveryFilter` in the terms Boxkey uses.
public struct ScanFilter: Sendable, Hashable {
    /// Report only devices advertising one of these (empty: all).
    public var serviceUUIDs: [String]
    /// Report only devices heard at or above this strength.
    public var minimumRSSI: Int?
    /// Report every advertisement, not only the first and changed ones (BlueZ `DuplicateData`).
    public var duplicates: Bool

    public init(serviceUUIDs: [String] = [], minimumRSSI: Int? = nil, duplicates: Bool = false) {
        self.serviceUUIDs = serviceUUIDs.map { $0.lowercased() }
        self.minimumRSSI = minimumRSSI
        self.duplicates = duplicates
    }

    public func matches(_ data: AdvertisingData, rssi: Int) -> Bool {
        if let minimumRSSI, rssi < minimumRSSI { return false }
        return serviceUUIDs.isEmpty || !Set(serviceUUIDs).isDisjoint(with: data.serviceUUIDs)
    }
}

public struct ScanResult: Sendable, Hashable {
    public var address: DeviceAddress
    public var rssi: Int
    public var advertisement: AdvertisingData
    /// When the advertisement was heard, on the radio's clock.
    public var timestamp: Duration

    public init(address: DeviceAddress, rssi: Int, advertisement: AdvertisingData, timestamp: Duration) {
        self.address = address
        self.rssi = rssi
        self.advertisement = advertisement
        self.timestamp = timestamp
    }
}

/// Why a link ended (HCI disconnect reasons, Core spec Vol 1 Part F, as BlueZ reports them).
public enum DisconnectReason: String, Sendable, Hashable, Codable {
    /// This side called disconnect.
    case localHost
    /// The peer disconnected (HCI 0x13 "Remote User Terminated Connection").
    case remoteUser
    /// Nothing heard for the supervision timeout: out of range or the peer vanished (HCI 0x08).
    case supervisionTimeout
    /// The adapter was powered off or the radio stack restarted.
    case radioOff
}

public enum RadioError: Error, Equatable, Sendable {
    /// No adapter, or the Bluetooth service is not running.
    case unavailable(String)
    case deviceNotFound(DeviceAddress)
    /// The connection attempt failed or was refused.
    case connectionFailed(String)
    case timedOut
    case notConnected
    case disconnected(DisconnectReason)
    case serviceNotFound(String)
    case characteristicNotFound(String)
    /// The characteristic lacks the property the operation needs.
    case notPermitted(String)
    /// The value does not fit the ATT MTU (ATT "Invalid Attribute Value Length").
    case invalidLength(length: Int, limit: Int)
    /// A BlueZ or D-Bus error, by name and message.
    case stack(name: String, message: String)
}

/// A connected central as the peripheral sees it: its address and which connection this is
/// (the same phone reconnecting is a new connection).
public struct CentralID: Hashable, Sendable, CustomStringConvertible {
    public let address: DeviceAddress
    public let connection: UInt64

    public init(address: DeviceAddress, connection: UInt64) {
        self.address = address
        self.connection = connection
    }

    public var description: String { "\(address)#\(connection)" }
}

/// What one ATT PDU carries at an MTU (Core spec Vol 3 Part F): the radios enforce these, and
/// the simulated one models BlueZ's choice of PDU for notifications.
public enum ATTLimits {
    /// Longest attribute value, whatever the MTU.
    public static let maximumValue = 512

    /// A Write Request or Write Command: opcode and handle leave MTU - 3.
    public static func writeValue(mtu: Int) -> Int { min(mtu - 3, maximumValue) }

    /// A notification as BlueZ 5.62+ sends it to a client that supports Multiple Handle Value
    /// Notifications (every BlueZ client does): handle and length per value leave MTU - 5, and
    /// BlueZ silently cuts a longer value.
    public static func notificationValue(mtu: Int) -> Int { min(mtu - 5, maximumValue) }
}

extension DisconnectReason: CustomStringConvertible {
    /// In words, for the journal (the phone says its own, translated: `sentence`).
    public var description: String {
        switch self {
        case .localHost: "closed on this side"
        case .remoteUser: "the other side ended it"
        case .supervisionTimeout: "nothing heard: out of range, or gone"
        case .radioOff: "the adapter was switched off or restarted"
        }
    }
}

extension RadioError: CustomStringConvertible {
    public var description: String {
        switch self {
        case .unavailable(let why): why
        case .deviceNotFound(let address): "no device \(address) nearby"
        case .connectionFailed(let why): "the connection failed: \(why)"
        case .timedOut: "timed out"
        case .notConnected: "not connected"
        case .disconnected(let reason): "disconnected (\(reason))"
        case .serviceNotFound(let uuid): "the device has no service \(uuid)"
        case .characteristicNotFound(let uuid): "the device has no characteristic \(uuid)"
        case .notPermitted(let what): "not permitted: \(what)"
        case .invalidLength(let length, let limit): "\(length) bytes do not fit (at most \(limit))"
        case .stack(let name, let message): message.isEmpty ? name : "\(message) (\(name))"
        }
    }
}
