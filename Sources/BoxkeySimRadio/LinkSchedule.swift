/// Which connection event each packet of one direction of a link goes out in. Pure.
///
/// Events happen at `anchor + k * interval`. A packet issued at time t goes in the first event
/// strictly after t (the controller is already in an event that starts at t) that still has
/// room, after every packet issued before it (the link is FIFO). At most `packetsPerEvent` go in
/// one event. A sender may run at most `transmitBuffer` packets ahead of the air: beyond that
/// its write is accepted only when enough events have passed (write-without-response flow
/// control).
public struct LinkSchedule: Sendable {
    public let anchor: Duration
    public let interval: Duration
    public let packetsPerEvent: Int
    public let transmitBuffer: Int

    private var tailEvent = -1
    private var usedInTail = 0
    /// Packets and events this direction has carried.
    public private(set) var packetsSent = 0

    public init(anchor: Duration, interval: Duration, packetsPerEvent: Int, transmitBuffer: Int) {
        self.anchor = anchor
        self.interval = interval
        self.packetsPerEvent = max(1, packetsPerEvent)
        self.transmitBuffer = max(packetsPerEvent, transmitBuffer)
    }

    public func time(ofEvent k: Int) -> Duration { anchor + interval * k }

    /// The first event strictly after `t`.
    public func firstEvent(after t: Duration) -> Int {
        if t < anchor { return 0 }
        return Int((t - anchor).nanoseconds / interval.nanoseconds) + 1
    }

    /// The event index `t` falls in (the last event at or before t).
    public func event(at t: Duration) -> Int {
        t < anchor ? -1 : Int((t - anchor).nanoseconds / interval.nanoseconds)
    }

    public struct Placement: Sendable, Equatable {
        public var firstEvent: Int
        public var lastEvent: Int
        /// When the sender's write call returns (the packets are in the controller's buffer).
        public var acceptedAt: Duration
        /// When the last packet is on the air (delivery time at the receiver).
        public var deliveredAt: Duration
    }

    public mutating func place(packets: Int, issuedAt t: Duration) -> Placement {
        precondition(packets > 0)
        var event = firstEvent(after: t)
        var used = 0
        if event <= tailEvent {
            event = tailEvent
            used = usedInTail
            if used == packetsPerEvent { event += 1; used = 0 }
        }
        let first = event
        var remaining = packets
        while remaining > 0 {
            let take = min(remaining, packetsPerEvent - used)
            remaining -= take
            used += take
            if remaining > 0 { event += 1; used = 0 }
        }
        tailEvent = event
        usedInTail = used
        packetsSent += packets
        // Packets still waiting after this write, counted in whole events of the air's pace.
        let eventsAhead = transmitBuffer / packetsPerEvent
        let acceptedEvent = event - eventsAhead
        let accepted = acceptedEvent >= firstEvent(after: t) ? time(ofEvent: acceptedEvent) : t
        return Placement(firstEvent: first, lastEvent: event, acceptedAt: max(t, accepted), deliveredAt: time(ofEvent: event))
    }

    /// The last event this direction used, or -1.
    public var lastEventUsed: Int { tailEvent }
}

extension Duration {
    /// Whole nanoseconds: integer arithmetic keeps event boundaries exact.
    public var nanoseconds: Int64 {
        components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000
    }
}
