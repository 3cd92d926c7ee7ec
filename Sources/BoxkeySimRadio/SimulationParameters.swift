import BoxkeyRadio

/// Every number the simulated radio models, with defaults from real devices.
public struct SimulationParameters: Sendable, Hashable {
    /// Connection interval. Linux as central asks for 30-50 ms (kernel `le_conn_min_interval`
    /// 0x0018 = 30 ms, `le_conn_max_interval` 0x0028 = 50 ms); controllers grant the minimum.
    public var connectionInterval: Duration = .milliseconds(30)
    /// Supervision timeout. Linux as central: 420 ms (kernel `le_supv_timeout` 0x002a).
    /// Android uses 5 s and iOS up to 6 s.
    public var supervisionTimeout: Duration = .milliseconds(420)
    /// ATT MTU each side offers in the MTU exchange; the link uses the smaller, clamped to
    /// 23...517 (Core spec Vol 3 Part F 3.4.2). 23 on both sides means no exchange.
    public var centralMTU = 23
    public var peripheralMTU = 23
    /// Link-layer payload per packet: 251 with Data Length Extension (Bluetooth 4.2+, every
    /// current phone and most Linux controllers), 27 without.
    public var linkLayerPayload = 251
    /// Link-layer packets per direction per connection event. Real stacks reach 4-7 at a
    /// 30 ms interval, bounded by the controller's buffers; 4 is the conservative end.
    public var packetsPerEvent = 4
    /// Controller transmit buffer, in packets: a Write Command waits when it is full.
    public var transmitBuffer = 8
    /// The random advDelay added to every advertising event, 0-10 ms (Core spec Vol 6 Part B
    /// 4.4.2.2.1).
    public var maxAdvertisingDelay: Duration = .milliseconds(10)
    /// Time from hearing a connectable advertisement to the first connection event
    /// (transmitWindowDelay 1.25 ms + the transmit window, Core spec Vol 6 Part B 4.5.3).
    public var connectionSetup: Duration = .microseconds(2500)
    /// Attribute-protocol round trips to discover a service (primary service by UUID,
    /// characteristics, descriptors).
    public var discoveryRoundTrips = 3
    /// The central keeps the database it discovered on a peripheral (BlueZ: `[GATT] Cache`,
    /// "always" by default) and on the next connection checks it with one read of the Database
    /// Hash (Robust Caching, Core 5.1) instead of discovering again. A peripheral whose service
    /// changed gets a different hash and is discovered in full.
    public var gattCaching = true
    /// Received power at 1 m: -59 dBm is the usual phone calibration (iBeacon "measured power").
    public var rssiAtOneMetre = -59.0
    /// Log-distance path-loss exponent: 2 in free space, 2.5 for an open office.
    public var pathLossExponent = 2.5
    /// Standard deviation of RSSI noise in dB (fast fading on a phone: 2-4 dB).
    public var rssiNoise = 2.0
    /// Beyond this distance no packet gets through; with the numbers above RSSI there is
    /// about -96 dBm, a typical receiver sensitivity for LE 1M.
    public var range = 30.0
    /// Seed for RSSI noise and advertising delays, so tests are repeatable.
    public var seed: UInt64 = 0x5EED

    public init() {}

    /// The MTU a link between these two offers ends up with.
    public var negotiatedMTU: Int {
        min(max(min(centralMTU, peripheralMTU), 23), 517)
    }

    /// Packets for one ATT PDU carrying `valueLength` bytes: ATT opcode + handle (3) and the
    /// L2CAP header (4) ride along.
    public func packets(forValueLength valueLength: Int) -> Int {
        let pdu = 3 + valueLength + 4
        return (pdu + linkLayerPayload - 1) / linkLayerPayload
    }
}

/// Whether deliveries wait for their modelled time on the clock (`realTime`, for programs),
/// or arrive at once carrying their modelled timestamps (`instant`, for tests that count
/// connection events). Timers (supervision timeout) always wait for the clock.
public enum Pacing: Sendable {
    case realTime
    case instant
}
