import BoxkeyRadio
import NIOConcurrencyHelpers

/// The simulated radio world: devices at positions on a line, advertisements, and links whose
/// every ATT operation lands on a modelled connection event. One `SimulatedAir` serves any
/// number of peripherals and centrals in one process; `SocketAir` (cross-process) builds on it.
///
/// Model, per link (see `SimulationParameters` for the numbers):
/// - connecting waits for the peripheral's next advertising event, then `connectionSetup`;
///   event 0 is at that anchor, and the MTU exchange (when both sides offer more than 23)
///   costs one round trip;
/// - each direction is a `LinkSchedule`: packets go in the first event strictly after they are
///   issued, at most `packetsPerEvent` per event, FIFO, with write-without-response flow control;
/// - a Write Request completes one event after its last packet (the ATT response), so a
///   sender can do one per two events; reads and discovery are such round trips too;
/// - RSSI comes from distance with noise; beyond `range` nothing gets through, and after
///   `supervisionTimeout` without contact both sides see `.supervisionTimeout`. Traffic sent
///   during a gap that ends before the timeout arrives late but whole (the link layer
///   retransmits); nothing is ever reordered or partly lost.
public final class SimulatedAir: Sendable {
    public let parameters: SimulationParameters
    public let clock: any RadioClock
    public let pacing: Pacing
    let state: NIOLockedValueBox<AirState>
    /// Advertisers appearing, changing or moving: scanners look again.
    let changes = ChangeSignal()

    public init(parameters: SimulationParameters = SimulationParameters(), clock: any RadioClock = MonotonicClock(), pacing: Pacing = .realTime) {
        self.parameters = parameters
        self.clock = clock
        self.pacing = pacing
        state = NIOLockedValueBox(AirState(rng: SeededGenerator(seed: parameters.seed)))
    }

    // MARK: Devices

    /// A peripheral at `position` metres.
    public func peripheral(_ address: DeviceAddress, at position: Double = 0) -> SimulatedPeripheral {
        let mailbox = TimedMailbox<PeripheralEvent>(clock: clock, pacing: pacing)
        state.withLockedValue { s in
            s.devices[address] = DeviceState(trajectory: .still(at: position))
            s.peripherals[address] = PeripheralState(mailbox: mailbox)
        }
        return SimulatedPeripheral(air: self, address: address, mailbox: mailbox)
    }

    /// A central at `position` metres.
    public func central(_ address: DeviceAddress, at position: Double = 1) -> SimulatedCentral {
        state.withLockedValue { s in s.devices[address] = DeviceState(trajectory: .still(at: position)) }
        return SimulatedCentral(air: self, address: address)
    }

    // MARK: Fault injection

    /// Moves a device to `position`, at constant speed over `duration` starting now. Links that
    /// leave range are lost `supervisionTimeout` after the last contact.
    public func move(_ address: DeviceAddress, to position: Double, over duration: Duration = .zero) {
        let now = clock.now
        state.withLockedValue { s in
            guard var device = s.devices[address] else { return }
            device.trajectory = Trajectory(from: device.trajectory.position(at: now), to: position, start: now, duration: duration)
            s.devices[address] = device
        }
        for link in links(of: address) {
            reevaluateRange(link, now: now)
            if link.central == address, let t = state.withLockedValue({ $0.devices[address]?.trajectory }) {
                link.peripheralSink.centralMoved(t)
            }
        }
        peripheralChanged(address)
        signalChange()
    }

    func peripheralChanged(_ address: DeviceAddress) {
        let hook = state.withLockedValue { $0.peripherals[address]?.mailbox != nil ? $0.onPeripheralChange : nil }
        hook?(address)
    }

    func refreshRemote() {
        let hook = state.withLockedValue { $0.refresher }
        hook?()
    }

    func remoteCentral(_ id: CentralID) -> (any RemoteCentral)? {
        state.withLockedValue { $0.remoteCentrals[id.connection] }
    }

    func remoteCentrals() -> [any RemoteCentral] {
        state.withLockedValue { Array($0.remoteCentrals.values) }
    }

    /// Ends radio contact on every link of `address` now, as interference or a dead battery
    /// would: both sides notice after the supervision timeout.
    public func dropLinks(of address: DeviceAddress) {
        let now = clock.now
        for link in links(of: address) { link.scheduleLoss(contactEnd: now, air: self) }
    }

    /// Makes a peripheral refuse (or accept again) new connections.
    public func refuseConnections(to address: DeviceAddress, _ refuse: Bool = true) {
        state.withLockedValue { s in s.devices[address]?.refusesConnections = refuse }
    }

    /// Adds host processing time to everything a device sends (a slow peer).
    public func slow(_ address: DeviceAddress, by delay: Duration) {
        state.withLockedValue { s in s.devices[address]?.processingDelay = delay }
    }

    public func position(of address: DeviceAddress) -> Double? {
        let now = clock.now
        return state.withLockedValue { $0.devices[address]?.trajectory.position(at: now) }
    }

    // MARK: Internals shared by the device types

    func links(of address: DeviceAddress) -> [SimLink] {
        state.withLockedValue { s in s.links.values.filter { $0.central == address || $0.peripheral == address } }
    }

    /// When a device's next action starts: now, or in instant pacing the time it last
    /// received or finished something (its causal time), plus its processing delay.
    func issueTime(_ address: DeviceAddress) -> Duration {
        let now = clock.now
        return state.withLockedValue { s in
            guard let d = s.devices[address] else { return now }
            return (pacing == .instant ? max(now, d.localTime) : now) + d.processingDelay
        }
    }

    /// Records that a device has seen time `t`; in real-time pacing, waits until then.
    func finish(_ address: DeviceAddress, at t: Duration) async throws {
        state.withLockedValue { s in
            if let d = s.devices[address] { s.devices[address]!.localTime = max(d.localTime, t) }
        }
        if pacing == .realTime { try await clock.sleep(until: t) }
    }

    func noteDelivery(to address: DeviceAddress, at t: Duration) {
        guard pacing == .instant else { return }
        state.withLockedValue { s in
            if let d = s.devices[address] { s.devices[address]!.localTime = max(d.localTime, t) }
        }
    }

    func distance(_ a: DeviceAddress, _ b: DeviceAddress, at t: Duration) -> Double? {
        state.withLockedValue { s in
            guard let da = s.devices[a], let db = s.devices[b] else { return nil }
            return abs(da.trajectory.position(at: t) - db.trajectory.position(at: t))
        }
    }

    func trajectories(_ a: DeviceAddress, _ b: DeviceAddress) -> (Trajectory, Trajectory)? {
        state.withLockedValue { s in
            guard let da = s.devices[a], let db = s.devices[b] else { return nil }
            return (da.trajectory, db.trajectory)
        }
    }

    func rssi(_ a: DeviceAddress, _ b: DeviceAddress, at t: Duration) -> Int? {
        guard let d = distance(a, b, at: t) else { return nil }
        let loss = PathLoss(parameters)
        return state.withLockedValue { s in loss.rssi(distance: d, using: &s.rng) }
    }

    /// Time of advertising event k of an advertiser: interval steps plus advDelay, which is
    /// random per event but fixed by the seed so that every observer sees the same air.
    func advertisingEvent(_ k: Int, of address: DeviceAddress, since: Duration, interval: Duration) -> Duration {
        var g = SeededGenerator(seed: parameters.seed ^ UInt64(truncatingIfNeeded: address.string.hashValueStable) ^ UInt64(k))
        let maxDelay = max(parameters.maxAdvertisingDelay.nanoseconds, 0)
        let delay = maxDelay > 0 ? Int64.random(in: 0...maxDelay, using: &g) : 0
        return since + interval * k + .nanoseconds(delay)
    }

    /// The first advertising event strictly after `t`.
    func nextAdvertisingEvent(of address: DeviceAddress, after t: Duration) -> (time: Duration, data: AdvertisingData)? {
        guard let adv = state.withLockedValue({ $0.peripherals[address]?.advertising }) else { return nil }
        var k = t < adv.since ? 0 : Int((t - adv.since).nanoseconds / adv.data.interval.nanoseconds)
        while true {
            let e = advertisingEvent(k, of: address, since: adv.since, interval: adv.data.interval)
            if e > t { return (e, adv.data) }
            k += 1
        }
    }

    func reevaluateRange(_ link: SimLink, now: Duration) {
        guard let (a, b) = trajectories(link.central, link.peripheral) else { return }
        link.reevaluate(central: a, peripheral: b, now: now, air: self)
    }

    // MARK: Change notification for scanners

    func signalChange() { changes.signal() }

    var changeVersion: UInt64 { changes.version }

    /// Waits until something scanners care about changes after `version`, or until `deadline`.
    func waitForChange(since version: UInt64, orUntil deadline: Duration) async {
        await changes.wait(since: version, until: deadline, clock: clock)
    }
}

struct DeviceState {
    var trajectory: Trajectory
    var localTime: Duration = .zero
    var processingDelay: Duration = .zero
    var refusesConnections = false
}

struct PeripheralState {
    /// Local peripherals: where their events go.
    var mailbox: TimedMailbox<PeripheralEvent>?
    /// Peripherals in another process: opens a link to them (`SocketAir`).
    var connector: (@Sendable (_ central: DeviceAddress, _ trajectory: Trajectory) async throws -> any PeripheralSink)?
    var service: GATTService?
    var advertising: (data: AdvertisingData, since: Duration)?
}

/// A central in another process connected to a local peripheral (`SocketAir`).
protocol RemoteCentral: Sendable {
    var id: CentralID { get }
    /// The local peripheral it is connected to.
    var peripheral: DeviceAddress { get }
    var mtu: Int { get }
    var downReason: DisconnectReason? { get }
    func isSubscribed(_ characteristic: String) -> Bool
    func notify(characteristic: String, value: [UInt8], issuedAt: Duration)
    func rssi(at t: Duration, peripheralPosition: Double, air: SimulatedAir) -> Int
    func disconnect(at t: Duration)
}

struct AirState {
    var devices: [DeviceAddress: DeviceState] = [:]
    var peripherals: [DeviceAddress: PeripheralState] = [:]
    var links: [UInt64: SimLink] = [:]
    var nextConnection: UInt64 = 0
    var rng: SeededGenerator
    var remoteCentrals: [UInt64: any RemoteCentral] = [:]
    /// Set by `SocketAir`: publishes a local peripheral's state for other processes.
    var onPeripheralChange: (@Sendable (DeviceAddress) -> Void)?
    /// Set by `SocketAir`: brings other processes' peripherals into this air.
    var refresher: (@Sendable () -> Void)?
}

extension String {
    /// FNV-1a: `hashValue` is randomly seeded per process, and the air must be repeatable.
    var hashValueStable: UInt64 {
        var h: UInt64 = 0xcbf29ce484222325
        for b in utf8 { h = (h ^ UInt64(b)) &* 0x100000001b3 }
        return h
    }
}
