/// What happens on a connected link, as the central sees it.
public enum LinkEvent: Sendable, Equatable {
    case notification(characteristic: String, value: [UInt8])
    case disconnected(DisconnectReason)
}

/// The central role (the phone), shaped after BlueZ's `Adapter1` and `Device1`.
public protocol CentralRadio: Sendable {
    var address: DeviceAddress { get }

    /// Scans until the consumer stops iterating (BlueZ `StartDiscovery`, `StopDiscovery`).
    func scan(_ filter: ScanFilter) -> AsyncThrowingStream<ScanResult, any Error>

    /// Connects, exchanges the MTU, and returns the link (BlueZ `Device1.Connect`).
    func connect(to address: DeviceAddress, timeout: Duration) async throws -> any CentralLink
}

/// One connected link.
public protocol CentralLink: Sendable {
    var peer: DeviceAddress { get }

    /// Notifications and the disconnect, in order. One consumer; ends after `.disconnected`.
    var events: AsyncStream<LinkEvent> { get }

    /// The ATT MTU agreed for this link.
    var mtu: Int { get async }

    /// Discovers a service and returns its characteristics (BlueZ: `ServicesResolved`).
    func discover(service uuid: String) async throws -> GATTService

    func read(_ characteristic: String) async throws -> [UInt8]

    /// Write Request (`withResponse`, returns after the ATT response) or Write Command.
    func write(_ characteristic: String, value: [UInt8], withResponse: Bool) async throws

    /// Enables notifications (writes the CCCD).
    func subscribe(_ characteristic: String) async throws

    /// Enables notifications and writes one message's `fragments` to `target` as Write Commands
    /// without waiting for the subscription's response, so they share connection events. The
    /// commands may reach the peripheral before the subscription does (BlueZ's ATT queue sends
    /// queued commands ahead of queued requests). Returns when the subscription's response is
    /// in and every fragment has been handed to the link.
    func subscribe(_ characteristic: String, thenWrite target: String, fragments: [[UInt8]]) async throws

    /// Disables notifications (writes the CCCD back to 0; BlueZ `StopNotify`): done before a
    /// planned disconnect, so the peripheral stops sending before the link goes.
    func unsubscribe(_ characteristic: String) async throws

    func rssi() async throws -> Int

    func disconnect() async
}

extension CentralLink {
    /// One after the other, the last fragment a Write Request, for a link with nothing better.
    public func subscribe(_ characteristic: String, thenWrite target: String, fragments: [[UInt8]]) async throws {
        try await subscribe(characteristic)
        for (i, value) in fragments.enumerated() { try await write(target, value: value, withResponse: i == fragments.count - 1) }
    }
}

/// What a link can report about its use of the air: connection events from the connection to
/// the last packet, ATT value bytes both ways, link-layer packets. The simulated radio counts
/// them; BlueZ does not expose them.
public protocol SimulatedLinkStatistics {
    var statistics: (events: Int, bytes: Int, packets: Int) { get }
}
