/// What happens to a peripheral, in order, on one stream.
public enum PeripheralEvent: Sendable, Equatable {
    case connected(CentralID, mtu: Int)
    /// The central enabled notifications (wrote the CCCD), BlueZ `StartNotify`/`AcquireNotify`.
    case subscribed(CentralID, characteristic: String)
    case unsubscribed(CentralID, characteristic: String)
    /// A write, with the link's MTU at the time. BlueZ does not say whether it was a Write
    /// Request or a Write Command, so neither does this interface.
    case wrote(CentralID, characteristic: String, value: [UInt8], mtu: Int)
    case disconnected(CentralID, reason: DisconnectReason)
}

/// The peripheral role (the box), shaped after BlueZ's `GattManager1`, `GattCharacteristic1`,
/// `LEAdvertisingManager1` and `Device1`.
public protocol PeripheralRadio: Sendable {
    /// The peripheral's own address.
    var address: DeviceAddress { get }

    /// Every connection, subscription, write and disconnect, in order. One consumer.
    var events: AsyncStream<PeripheralEvent> { get }

    /// Publishes the GATT service (BlueZ `RegisterApplication` with the whole tree).
    func publish(_ service: GATTService) async throws

    /// Replaces a readable characteristic's value in the published service: the next read
    /// returns it (no new registration; connected centrals are not disturbed).
    func setValue(_ value: [UInt8], of characteristic: String) async

    /// Starts advertising, or replaces the advertisement (BlueZ `RegisterAdvertisement`).
    func advertise(_ data: AdvertisingData) async throws

    func stopAdvertising() async

    /// Sends a notification to one subscribed central.
    func notify(_ central: CentralID, characteristic: String, value: [UInt8]) async throws

    /// The connected link's RSSI in dBm (connected-link RSSI, HCI Read RSSI).
    func rssi(of central: CentralID) async throws -> Int

    func disconnect(_ central: CentralID) async
}
