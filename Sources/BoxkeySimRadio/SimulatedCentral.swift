import BoxkeyRadio
import NIOConcurrencyHelpers

/// The central role on the simulated air.
public final class SimulatedCentral: CentralRadio {
    public let address: DeviceAddress
    let air: SimulatedAir
    /// The database hash of each peripheral this central discovered (its GATT cache).
    let cache = NIOLockedValueBox<[DeviceAddress: Int]>([:])

    init(air: SimulatedAir, address: DeviceAddress) {
        self.air = air
        self.address = address
    }

    public func scan(_ filter: ScanFilter) -> AsyncThrowingStream<ScanResult, any Error> {
        let cursor = ScanCursor(air: air, scanner: address, filter: filter, start: air.issueTime(address))
        return AsyncThrowingStream(unfolding: { try await cursor.next() })
    }

    public func connect(to peer: DeviceAddress, timeout: Duration) async throws -> any CentralLink {
        try await connectLink(to: peer, timeout: timeout)
    }

    /// `connect`, returning the concrete link (for tests that read its trace).
    public func connectLink(to peer: DeviceAddress, timeout: Duration) async throws -> SimulatedLink {
        air.refreshRemote()
        let t = air.issueTime(address)
        let (entry, refuses, trajectory) = air.state.withLockedValue { s in
            (s.peripherals[peer], s.devices[peer]?.refusesConnections ?? false, s.devices[address]?.trajectory ?? .still(at: 0))
        }
        guard let entry else { throw RadioError.deviceNotFound(peer) }
        let service = entry.service
        let inRange = (air.distance(address, peer, at: t) ?? .infinity) <= air.parameters.range
        guard !refuses, inRange, let advert = air.nextAdvertisingEvent(of: peer, after: t) else {
            // Nothing answers: BlueZ gives up at the connection timeout.
            try await air.clock.sleep(until: t + timeout)
            throw refuses ? RadioError.connectionFailed("connection refused by \(peer)") : RadioError.timedOut
        }
        let sink: any PeripheralSink
        if let mailbox = entry.mailbox {
            sink = mailbox
        } else if let connector = entry.connector {
            do { sink = try await connector(address, trajectory) } catch {
                throw RadioError.connectionFailed("\(peer) did not answer: \(error)")
            }
        } else {
            throw RadioError.deviceNotFound(peer)
        }
        let parameters = air.parameters
        let anchor = max(advert.time, air.clock.now) + parameters.connectionSetup
        let link = SimLink(id: air.nextConnectionID(), central: address, peripheral: peer, service: service, anchor: anchor,
                           parameters: parameters, centralMailbox: TimedMailbox(clock: air.clock, pacing: air.pacing), peripheralSink: sink)
        var ready = anchor
        let mtu = parameters.negotiatedMTU
        if mtu > 23 {
            // ATT Exchange MTU Request and Response: one round trip.
            let request = link.sendToPeripheral(packets: 1, valueBytes: 2, issuedAt: anchor, event: nil, air: air)
            ready = link.sendToCentral(packets: 1, valueBytes: 2, issuedAt: request.deliveredAt, event: nil, air: air).deliveredAt
        }
        link.setMTU(mtu)
        guard ready - t <= timeout else {
            sink.linkEnded()
            try await air.clock.sleep(until: t + timeout)
            throw RadioError.timedOut
        }
        air.register(link)
        (sink as? SocketPeripheralSink)?.attach(link, air: air)
        sink.deliver(.connected(link.centralID, mtu: mtu), at: ready, waitsForClock: false, tag: nil)
        air.noteDelivery(to: peer, at: ready)
        air.reevaluateRange(link, now: t)
        try await air.finish(address, at: ready)
        return SimulatedLink(air: air, link: link, cache: cache)
    }
}

/// One link as the central sees it.
public final class SimulatedLink: CentralLink {
    public var peer: DeviceAddress { link.peripheral }
    public let events: AsyncStream<LinkEvent>
    let air: SimulatedAir
    let link: SimLink
    let cache: NIOLockedValueBox<[DeviceAddress: Int]>

    init(air: SimulatedAir, link: SimLink, cache: NIOLockedValueBox<[DeviceAddress: Int]>) {
        self.air = air
        self.link = link
        self.cache = cache
        let ended = NIOLockedValueBox(false)
        let mailbox = link.centralMailbox
        self.events = AsyncStream(unfolding: {
            if ended.withLockedValue({ $0 }) { return nil }
            let event = await mailbox.next()
            if case .disconnected = event {
                ended.withLockedValue { $0 = true }
                air.forget(link)
            }
            return event
        })
    }

    public var mtu: Int { get async { link.mtu } }

    /// When connection event 0 happened; events are `connectionInterval` apart from there.
    public var anchor: Duration { link.anchor }

    /// Every placement on this link so far, both ways.
    public var trace: [LinkTraceEntry] { link.trace }

    private var central: DeviceAddress { link.central }

    private func begin() throws -> Duration {
        let t = air.issueTime(central)
        if let reason = link.downReason(at: t) { throw RadioError.disconnected(reason) }
        return t
    }

    /// One ATT request/response pair issued at `t`, or when the request before it got its
    /// response if that is later; returns when the response arrives.
    private func roundTrip(at t: Duration, requestBytes: Int, responseBytes: Int, event: PeripheralEvent? = nil) -> Duration {
        let p = air.parameters
        return link.requestFree.withLockedValue { free in
            let request = link.sendToPeripheral(packets: p.packets(forValueLength: requestBytes), valueBytes: requestBytes, issuedAt: max(t, free), event: event, air: air)
            free = link.sendToCentral(packets: p.packets(forValueLength: responseBytes), valueBytes: responseBytes, issuedAt: request.deliveredAt, event: nil, air: air).deliveredAt
            return free
        }
    }

    public func discover(service uuid: String) async throws -> GATTService {
        var t = try begin()
        let hash = link.service?.hashValue
        if air.parameters.gattCaching, let hash, cache.withLockedValue({ $0[link.peripheral] }) == hash {
            // Read By Type (Database Hash): the 16-byte hash matches, the cache stands.
            t = roundTrip(at: t, requestBytes: 6, responseBytes: 20)
        } else {
            for _ in 0..<air.parameters.discoveryRoundTrips {
                t = roundTrip(at: t, requestBytes: 4, responseBytes: min(link.mtu - 1, 20))
            }
            if let hash { cache.withLockedValue { $0[link.peripheral] = hash } }
        }
        try await air.finish(central, at: try await link.completion(of: t, clock: air.clock))
        guard let service = link.service, service.uuid == uuid.lowercased() else { throw RadioError.serviceNotFound(uuid) }
        return service
    }

    public func read(_ characteristic: String) async throws -> [UInt8] {
        var t = try begin()
        let c = try characteristicOrThrow(characteristic)
        guard c.properties.contains(.read) else { throw RadioError.notPermitted("read on \(c.uuid)") }
        let value = c.value ?? []
        // ATT Read returns MTU-1 bytes; a full response means the client goes on with Read Blob.
        let chunk = link.mtu - 1
        var offset = 0
        repeat {
            let n = min(chunk, value.count - offset)
            t = roundTrip(at: t, requestBytes: offset == 0 ? 2 : 4, responseBytes: n)
            offset += n
            if n < chunk { break }
        } while true
        try await air.finish(central, at: try await link.completion(of: t, clock: air.clock))
        return value
    }

    public func write(_ characteristic: String, value: [UInt8], withResponse: Bool) async throws {
        let t = try begin()
        let c = try characteristicOrThrow(characteristic)
        guard c.properties.contains(withResponse ? .write : .writeWithoutResponse) else {
            throw RadioError.notPermitted((withResponse ? "write" : "write-without-response") + " on \(c.uuid)")
        }
        let mtu = link.mtu
        let limit = ATTLimits.writeValue(mtu: mtu)
        guard value.count <= limit else { throw RadioError.invalidLength(length: value.count, limit: limit) }
        let event = PeripheralEvent.wrote(link.centralID, characteristic: c.uuid, value: value, mtu: mtu)
        let p = air.parameters
        if withResponse {
            let done = roundTrip(at: t, requestBytes: value.count, responseBytes: 0, event: event)
            try await air.finish(central, at: try await link.completion(of: done, clock: air.clock))
        } else {
            let placement = link.sendToPeripheral(packets: p.packets(forValueLength: value.count), valueBytes: value.count, issuedAt: t, event: event, air: air)
            try await air.finish(central, at: placement.acceptedAt)
        }
    }

    public func subscribe(_ characteristic: String) async throws {
        try await subscribe(characteristic, thenWrite: characteristic, fragments: [])
    }

    /// As BlueZ may put them on the air, the worst case for the peripheral: the commands first
    /// (its ATT queue sends queued commands ahead of queued requests), then the CCCD's Write
    /// Request.
    public func subscribe(_ characteristic: String, thenWrite target: String, fragments: [[UInt8]]) async throws {
        let t = try begin()
        let c = try characteristicOrThrow(characteristic)
        guard c.properties.contains(.notify) else { throw RadioError.notPermitted("notify on \(c.uuid)") }
        let written = fragments.isEmpty ? nil : try characteristicOrThrow(target)
        if let written, !written.properties.contains(.writeWithoutResponse) {
            throw RadioError.notPermitted("write on \(written.uuid)")
        }
        let limit = ATTLimits.writeValue(mtu: link.mtu)
        if let long = fragments.first(where: { $0.count > limit }) { throw RadioError.invalidLength(length: long.count, limit: limit) }
        let p = air.parameters
        var done = t
        for value in fragments {
            let event = PeripheralEvent.wrote(link.centralID, characteristic: written!.uuid, value: value, mtu: link.mtu)
            done = max(done, link.sendToPeripheral(packets: p.packets(forValueLength: value.count), valueBytes: value.count, issuedAt: t, event: event, air: air).acceptedAt)
        }
        link.subscribe(c.uuid)
        done = max(done, roundTrip(at: t, requestBytes: 2, responseBytes: 0, event: .subscribed(link.centralID, characteristic: c.uuid)))
        try await air.finish(central, at: try await link.completion(of: done, clock: air.clock))
    }

    public func unsubscribe(_ characteristic: String) async throws {
        let t = try begin()
        let c = try characteristicOrThrow(characteristic)
        guard c.properties.contains(.notify) else { throw RadioError.notPermitted("notify on \(c.uuid)") }
        link.unsubscribe(c.uuid)
        let done = roundTrip(at: t, requestBytes: 2, responseBytes: 0, event: .unsubscribed(link.centralID, characteristic: c.uuid))
        try await air.finish(central, at: try await link.completion(of: done, clock: air.clock))
    }

    public func rssi() async throws -> Int {
        let t = try begin()
        guard let rssi = air.rssi(central, link.peripheral, at: t) else { throw RadioError.notConnected }
        return rssi
    }

    public func disconnect() async {
        link.close(by: .toPeripheral, at: air.issueTime(central), air: air)
    }

    private func characteristicOrThrow(_ uuid: String) throws -> GATTCharacteristic {
        guard let c = link.service?.characteristic(uuid) else { throw RadioError.characteristicNotFound(uuid.lowercased()) }
        return c
    }
}

/// A scan in progress: yields each matching advertiser at its first advertising event heard
/// after the scan started (and again when its data changes, or every event with `duplicates`).
/// The scanner listens continuously, as BlueZ discovery does (100% scan duty cycle).
final class ScanCursor: Sendable {
    private struct State {
        var cursor: Duration
        var reported: [DeviceAddress: AdvertisingData] = [:]
    }
    private let air: SimulatedAir
    private let scanner: DeviceAddress
    private let filter: ScanFilter
    private let state: NIOLockedValueBox<State>

    init(air: SimulatedAir, scanner: DeviceAddress, filter: ScanFilter, start: Duration) {
        self.air = air
        self.scanner = scanner
        self.filter = filter
        self.state = NIOLockedValueBox(State(cursor: start))
    }

    func next() async throws -> ScanResult? {
        while true {
            try Task.checkCancellation()
            air.refreshRemote()
            let version = air.changeVersion
            let (after, reported) = state.withLockedValue { ($0.cursor, $0.reported) }
            let advertisers = air.state.withLockedValue { s in s.peripherals.filter { $0.value.advertising != nil }.map(\.key) }
            var best: ScanResult?
            for address in advertisers where address != scanner {
                var t = after
                for _ in 0..<64 {
                    guard let (event, data) = air.nextAdvertisingEvent(of: address, after: t) else { break }
                    if let best, event >= best.timestamp { break }
                    t = event
                    if !filter.duplicates, reported[address] == data { break }
                    guard let d = air.distance(scanner, address, at: event), d <= air.parameters.range,
                          let rssi = air.rssi(scanner, address, at: event), filter.matches(data, rssi: rssi) else { continue }
                    best = ScanResult(address: address, rssi: rssi, advertisement: data, timestamp: event)
                    break
                }
            }
            if let best {
                if air.pacing == .realTime { try await air.clock.sleep(until: best.timestamp) }
                state.withLockedValue { s in
                    s.cursor = best.timestamp
                    s.reported[best.address] = best.advertisement
                }
                return best
            }
            // Other processes' advertisers are polled, so wake often when there may be some.
            let poll: Duration = air.state.withLockedValue { $0.refresher } == nil ? .seconds(1) : .milliseconds(50)
            await air.waitForChange(since: version, orUntil: air.clock.now + poll)
            let now = air.clock.now
            state.withLockedValue { $0.cursor = max($0.cursor, now) }
        }
    }
}
