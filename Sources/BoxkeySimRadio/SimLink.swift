import BoxkeyRadio
import NIOConcurrencyHelpers

/// Where a link delivers what the peripheral should see: the peripheral's own mailbox in this
/// process, or a socket to the peripheral's process (`SocketAir`).
protocol PeripheralSink: Sendable {
    func deliver(_ event: PeripheralEvent, at time: Duration, waitsForClock: Bool, tag: UInt64?)
    func remove(tag: UInt64)
    /// Removes and returns traffic due after `time` that has not been consumed yet.
    func take(after time: Duration) -> [(PeripheralEvent, Duration)]
    /// The central moved (the peripheral's process computes RSSI from it).
    func centralMoved(_ trajectory: Trajectory)
    /// The link is over; release what carries it.
    func linkEnded()
}

extension TimedMailbox: PeripheralSink where Item == PeripheralEvent {
    func deliver(_ event: PeripheralEvent, at time: Duration, waitsForClock: Bool, tag: UInt64?) {
        push(event, at: time, waitsForClock: waitsForClock, tag: tag)
    }
    func take(after time: Duration) -> [(PeripheralEvent, Duration)] {
        (take(after: time) as [Entry]).map { ($0.item, $0.time) }
    }
    func centralMoved(_ trajectory: Trajectory) {}
    func linkEnded() {}
}

/// One placement on a link, for tests and benchmarks that count connection events.
public struct LinkTraceEntry: Sendable, Equatable {
    public enum Direction: Sendable { case toPeripheral, toCentral }
    public var direction: Direction
    public var packets: Int
    public var valueBytes: Int
    public var firstEvent: Int
    public var lastEvent: Int
}

/// A connection between a central and a peripheral, owned by the central's side of the air
/// (the central is the link-layer master: it owns the connection-event schedule).
final class SimLink: Sendable {
    struct Loss {
        var contactEnd: Duration
        var lossTime: Duration
        var tag: UInt64
    }
    enum Held {
        case toCentral(LinkEvent, Duration)
        case toPeripheral(PeripheralEvent, Duration)
    }
    struct State {
        var toPeripheral: LinkSchedule
        var toCentral: LinkSchedule
        var mtu: Int
        var subscriptions: Set<String> = []
        var closed: DisconnectReason?
        var loss: Loss?
        var resumedAt: Duration = .zero
        var held: [Held] = []
        var trace: [LinkTraceEntry] = []
    }

    static let traceLimit = 4096

    let id: UInt64
    let central: DeviceAddress
    let peripheral: DeviceAddress
    let centralID: CentralID
    let service: GATTService?
    let parameters: SimulationParameters
    let centralMailbox: TimedMailbox<LinkEvent>
    let peripheralSink: any PeripheralSink
    let state: NIOLockedValueBox<State>
    /// When the central's last ATT request got its response: ATT lets a client have one
    /// request outstanding on a link (commands and notifications are not held by it).
    let requestFree = NIOLockedValueBox<Duration>(.zero)

    init(id: UInt64, central: DeviceAddress, peripheral: DeviceAddress, service: GATTService?, anchor: Duration,
         parameters: SimulationParameters, centralMailbox: TimedMailbox<LinkEvent>, peripheralSink: any PeripheralSink) {
        self.id = id
        self.central = central
        self.peripheral = peripheral
        self.centralID = CentralID(address: central, connection: id)
        self.service = service
        self.parameters = parameters
        self.centralMailbox = centralMailbox
        self.peripheralSink = peripheralSink
        let schedule = LinkSchedule(anchor: anchor, interval: parameters.connectionInterval,
                                    packetsPerEvent: parameters.packetsPerEvent, transmitBuffer: parameters.transmitBuffer)
        state = NIOLockedValueBox(State(toPeripheral: schedule, toCentral: schedule, mtu: 23))
    }

    var mtu: Int { state.withLockedValue { $0.mtu } }
    var anchor: Duration { state.withLockedValue { $0.toPeripheral.anchor } }
    var trace: [LinkTraceEntry] { state.withLockedValue { $0.trace } }

    /// Why the link is down at time `t`, or nil while it is up.
    func downReason(at t: Duration) -> DisconnectReason? {
        state.withLockedValue { s in
            if let closed = s.closed { return closed }
            if let loss = s.loss, t >= loss.lossTime { return .supervisionTimeout }
            return nil
        }
    }

    // MARK: Traffic

    func sendToPeripheral(packets: Int, valueBytes: Int, issuedAt t: Duration, event: PeripheralEvent?, air: SimulatedAir) -> LinkSchedule.Placement {
        let (placement, hold) = state.withLockedValue { s -> (LinkSchedule.Placement, Bool) in
            let p = s.toPeripheral.place(packets: packets, issuedAt: max(t, s.resumedAt))
            record(&s, .toPeripheral, packets, valueBytes, p)
            let hold = s.loss.map { p.deliveredAt > $0.contactEnd } ?? false
            if hold, let event { s.held.append(.toPeripheral(event, p.deliveredAt)) }
            return (p, hold)
        }
        if !hold, let event {
            peripheralSink.deliver(event, at: placement.deliveredAt, waitsForClock: false, tag: nil)
            air.noteDelivery(to: peripheral, at: placement.deliveredAt)
        }
        return placement
    }

    func sendToCentral(packets: Int, valueBytes: Int, issuedAt t: Duration, event: LinkEvent?, air: SimulatedAir) -> LinkSchedule.Placement {
        let (placement, hold) = state.withLockedValue { s -> (LinkSchedule.Placement, Bool) in
            let p = s.toCentral.place(packets: packets, issuedAt: max(t, s.resumedAt))
            record(&s, .toCentral, packets, valueBytes, p)
            let hold = s.loss.map { p.deliveredAt > $0.contactEnd } ?? false
            if hold, let event { s.held.append(.toCentral(event, p.deliveredAt)) }
            return (p, hold)
        }
        if !hold, let event {
            centralMailbox.push(event, at: placement.deliveredAt)
            air.noteDelivery(to: central, at: placement.deliveredAt)
        }
        return placement
    }

    private func record(_ s: inout State, _ d: LinkTraceEntry.Direction, _ packets: Int, _ bytes: Int, _ p: LinkSchedule.Placement) {
        if s.trace.count >= Self.traceLimit { s.trace.removeFirst(s.trace.count / 2) }
        s.trace.append(LinkTraceEntry(direction: d, packets: packets, valueBytes: bytes, firstEvent: p.firstEvent, lastEvent: p.lastEvent))
    }

    /// Waits, if the link is in a gap, until an operation due at `t` can complete; throws if
    /// the gap ends in a supervision timeout. Returns the completion time.
    func completion(of t: Duration, clock: any RadioClock) async throws -> Duration {
        while true {
            let gap = state.withLockedValue { s -> (Loss?, DisconnectReason?, Duration) in
                if let closed = s.closed { return (nil, closed, .zero) }
                if let loss = s.loss, t > loss.contactEnd { return (loss, nil, .zero) }
                return (nil, nil, max(t, s.resumedAt))
            }
            if let reason = gap.1 { throw RadioError.disconnected(reason) }
            guard let loss = gap.0 else { return gap.2 }
            try await clock.sleep(until: loss.lossTime)
            let stillLost = state.withLockedValue { $0.loss?.tag == loss.tag }
            if stillLost { throw RadioError.disconnected(.supervisionTimeout) }
        }
    }

    // MARK: Range and loss

    /// Contact ends at `contactEnd`; both sides hear of it `supervisionTimeout` later.
    func scheduleLoss(contactEnd: Duration, air: SimulatedAir) {
        let tag = UInt64.random(in: 1...UInt64.max)
        let lossTime = contactEnd + parameters.supervisionTimeout
        let scheduled = state.withLockedValue { s -> Bool in
            guard s.closed == nil, s.loss == nil else { return false }
            s.loss = Loss(contactEnd: contactEnd, lossTime: lossTime, tag: tag)
            return true
        }
        guard scheduled else { return }
        // Traffic already queued for after the contact ended waits in `held`.
        let lateToCentral = centralMailbox.take(after: contactEnd)
        let lateToPeripheral = peripheralSink.take(after: contactEnd)
        state.withLockedValue { s in
            s.held += lateToCentral.map { .toCentral($0.item, $0.time) }
            s.held += lateToPeripheral.map { .toPeripheral($0.0, $0.1) }
        }
        centralMailbox.push(.disconnected(.supervisionTimeout), at: lossTime, waitsForClock: true, tag: tag)
        peripheralSink.deliver(.disconnected(centralID, reason: .supervisionTimeout), at: lossTime, waitsForClock: true, tag: tag)
    }

    /// Contact is back at `t` before the supervision timeout: deliver what waited, late.
    func cancelLoss(resumeAt t: Duration, air: SimulatedAir) {
        let (tag, held) = state.withLockedValue { s -> (UInt64?, [Held]) in
            guard let loss = s.loss, t < loss.lossTime else { return (nil, []) }
            s.loss = nil
            s.resumedAt = t
            defer { s.held = [] }
            return (loss.tag, s.held)
        }
        guard let tag else { return }
        centralMailbox.remove(tag: tag)
        peripheralSink.remove(tag: tag)
        for h in held {
            switch h {
            case .toCentral(let e, let time): centralMailbox.push(e, at: max(time, t))
            case .toPeripheral(let e, let time): peripheralSink.deliver(e, at: max(time, t), waitsForClock: false, tag: nil)
            }
        }
    }

    /// Re-plans loss after either end moved.
    func reevaluate(central a: Trajectory, peripheral b: Trajectory, now: Duration, air: SimulatedAir) {
        let range = parameters.range
        let pending = state.withLockedValue { $0.loss }
        if pending != nil {
            if abs(a.position(at: now) - b.position(at: now)) <= range {
                cancelLoss(resumeAt: now, air: air)
            } else {
                return   // still out of range: the planned loss stands
            }
        }
        if let exit = firstExit(a, b, range: range, after: now) {
            scheduleLoss(contactEnd: exit, air: air)
        }
    }

    /// Ends the link now from one side: the other side hears LL_TERMINATE_IND on the next event.
    func close(by side: LinkTraceEntry.Direction, at t: Duration, air: SimulatedAir) {
        let first = state.withLockedValue { s -> Bool in
            guard s.closed == nil, s.loss.map({ t < $0.lossTime }) ?? true else { return false }
            s.closed = .localHost
            if let loss = s.loss { s.loss = nil; centralMailbox.remove(tag: loss.tag); peripheralSink.remove(tag: loss.tag) }
            return true
        }
        guard first else { return }
        let placement = state.withLockedValue { s in
            side == .toPeripheral ? s.toPeripheral.place(packets: 1, issuedAt: t) : s.toCentral.place(packets: 1, issuedAt: t)
        }
        switch side {
        case .toPeripheral:   // the central hung up
            centralMailbox.push(.disconnected(.localHost), at: t)
            peripheralSink.deliver(.disconnected(centralID, reason: .remoteUser), at: placement.deliveredAt, waitsForClock: false, tag: nil)
        case .toCentral:      // the peripheral hung up
            peripheralSink.deliver(.disconnected(centralID, reason: .localHost), at: t, waitsForClock: false, tag: nil)
            centralMailbox.push(.disconnected(.remoteUser), at: placement.deliveredAt)
        }
        air.forget(self)
    }

    func subscribe(_ characteristic: String) {
        state.withLockedValue { _ = $0.subscriptions.insert(characteristic) }
    }

    func unsubscribe(_ characteristic: String) {
        state.withLockedValue { _ = $0.subscriptions.remove(characteristic) }
    }

    func isSubscribed(_ characteristic: String) -> Bool {
        state.withLockedValue { $0.subscriptions.contains(characteristic) }
    }

    func setMTU(_ mtu: Int) { state.withLockedValue { $0.mtu = mtu } }
}

/// The first time after `t` when two devices on these trajectories are more than `range`
/// apart. Distance is piecewise linear between the trajectories' start and end points.
func firstExit(_ a: Trajectory, _ b: Trajectory, range: Double, after t: Duration) -> Duration? {
    func gap(_ x: Duration) -> Double { abs(a.position(at: x) - b.position(at: x)) }
    if gap(t) > range { return t }
    var points = [t, a.start, a.start + a.duration, b.start, b.start + b.duration].filter { $0 > t }
    points.sort()
    var previous = t
    for p in points {
        if gap(p) > range {
            // Bisect the crossing inside (previous, p] to a microsecond.
            var lo = previous, hi = p
            while hi - lo > .microseconds(1) {
                let mid = lo + (hi - lo) / 2
                if gap(mid) > range { hi = mid } else { lo = mid }
            }
            return hi
        }
        previous = p
    }
    return nil
}

extension SimulatedAir {
    func register(_ link: SimLink) {
        state.withLockedValue { $0.links[link.id] = link }
    }

    func forget(_ link: SimLink) {
        let removed = state.withLockedValue { $0.links.removeValue(forKey: link.id) }
        if removed != nil { link.peripheralSink.linkEnded() }
    }

    func link(for central: CentralID) -> SimLink? {
        state.withLockedValue { $0.links[central.connection] }
    }

    func nextConnectionID() -> UInt64 {
        state.withLockedValue { s in s.nextConnection += 1; return s.nextConnection }
    }
}
