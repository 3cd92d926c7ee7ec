import BoxkeyDBus
import BoxkeyRadio
import NIOConcurrencyHelpers

/// The phone's radio through BlueZ: discovery with `Adapter1.SetDiscoveryFilter` and
/// `StartDiscovery`, results from `Device1` properties, links through `Device1.Connect`.
public final class BlueZCentral: CentralRadio, @unchecked Sendable {
    public let address: DeviceAddress
    public let adapter: BlueZAdapter
    let objects: BlueZObjects
    let bus: DBusConnection
    private let clock = MonotonicClock()

    public init(adapter adapterName: String? = nil, bus busKind: DBusConnection.Bus = .system) async throws {
        (bus, objects, adapter) = try await BlueZ.open(adapter: adapterName, bus: busKind)
        address = adapter.address
    }

    public func close() {
        objects.close()
        bus.close()
    }

    public func scan(_ filter: ScanFilter) -> AsyncThrowingStream<ScanResult, any Error> {
        let (stream, continuation) = AsyncThrowingStream<ScanResult, any Error>.makeStream()
        let task = Task { [self] in
            let changes = objects.changes()
            var discovery: [String: DBusValue] = ["Transport": .string("le"), "DuplicateData": .bool(filter.duplicates)]
            if !filter.serviceUUIDs.isEmpty { discovery["UUIDs"] = .strings(filter.serviceUUIDs) }
            if let rssi = filter.minimumRSSI { discovery["RSSI"] = .int16(Int16(clamping: rssi)) }
            do {
                try await BlueZ.retrying {
                    _ = try await bus.call(BlueZ.service, adapter.path, BlueZ.adapter, "SetDiscoveryFilter", [.vardict(discovery)], timeout: .seconds(5))
                    _ = try await bus.call(BlueZ.service, adapter.path, BlueZ.adapter, "StartDiscovery", timeout: .seconds(5))
                }
            } catch {
                continuation.finish(throwing: BlueZ.radioError(error))
                return
            }
            // Devices BlueZ already knows carry an RSSI only if heard in this discovery.
            for (path, props) in objects.objects(with: BlueZ.device, under: adapter.path + "/") {
                if let r = result(path, props, filter) { continuation.yield(r) }
            }
            for await change in changes {
                switch change {
                case .added(let path, let interfaces) where interfaces.contains(BlueZ.device):
                    if path.hasPrefix(adapter.path + "/"), let props = objects.properties(path, BlueZ.device), let r = result(path, props, filter) {
                        continuation.yield(r)
                    }
                case .changed(let path, BlueZ.device, let changed) where path.hasPrefix(adapter.path + "/"):
                    guard changed["RSSI"] != nil || changed["ManufacturerData"] != nil || changed["UUIDs"] != nil,
                          let props = objects.properties(path, BlueZ.device) else { continue }
                    if let r = result(path, props, filter) { continuation.yield(r) }
                case .service(present: false):
                    continuation.finish(throwing: RadioError.unavailable("bluetoothd stopped"))
                    return
                case .changed(adapter.path, BlueZ.adapter, let props) where props["Powered"]?.bool == false:
                    continuation.finish(throwing: RadioError.unavailable("adapter \(adapter.name) was powered off"))
                    return
                default:
                    continue
                }
            }
        }
        continuation.onTermination = { [bus, adapter] _ in
            task.cancel()
            bus.send(BlueZ.service, adapter.path, BlueZ.adapter, "StopDiscovery", [])
        }
        return stream
    }

    private func result(_ path: String, _ props: [String: DBusValue], _ filter: ScanFilter) -> ScanResult? {
        guard let rssi = props["RSSI"]?.int, let a = props["Address"]?.string.flatMap(DeviceAddress.init) else { return nil }
        var manufacturer: [UInt16: [UInt8]] = [:]
        for (k, v) in props["ManufacturerData"]?.entries ?? [] {
            if let id = k.int, let bytes = v.unwrapped.bytes { manufacturer[UInt16(truncatingIfNeeded: id)] = bytes }
        }
        let data = AdvertisingData(serviceUUIDs: props["UUIDs"]?.strings ?? [], manufacturerData: manufacturer, localName: props["Name"]?.string)
        guard filter.matches(data, rssi: rssi) else { return nil }
        return ScanResult(address: a, rssi: rssi, advertisement: data, timestamp: clock.now)
    }

    public func connect(to peer: DeviceAddress, timeout: Duration) async throws -> any CentralLink {
        let path = BlueZ.devicePath(adapter: adapter.path, peer)
        guard objects.properties(path, BlueZ.device) != nil else { throw RadioError.deviceNotFound(peer) }
        let deadline = clock.now + timeout
        // BlueZ sometimes drops a fresh LE link before its services resolve (seen in the lab
        // right after an earlier link to the same box ended; bleak-retry-connector exists for
        // the same reason). One more try, within the same deadline, is what a person would do.
        var attempts = 0
        while true {
            attempts += 1
            do {
                return try await connectOnce(path: path, peer: peer, deadline: deadline)
            } catch BlueZLink.EndedWhileResolving.ended where attempts < Self.connectAttempts && clock.now < deadline {
                continue
            } catch BlueZLink.EndedWhileResolving.ended {
                throw RadioError.connectionFailed("disconnected while resolving services")
            }
        }
    }

    /// How often a link that ends while its services resolve is tried (see `connect`).
    static let connectAttempts = 2

    private func connectOnce(path: String, peer: DeviceAddress, deadline: Duration) async throws -> BlueZLink {
        let link = BlueZLink(central: self, peer: peer, path: path)
        do {
            if objects.isConnected(path) {
                // A link someone left up (another process, or one that exited before its
                // disconnect went out): start from a link of our own, or its end would be ours.
                _ = try? await bus.call(BlueZ.service, path, BlueZ.device, "Disconnect", timeout: .seconds(5))
                await objects.waitUntilDisconnected(path, until: deadline)
            }
            try await BlueZ.retrying {
                _ = try await bus.call(BlueZ.service, path, BlueZ.device, "Connect", timeout: max(deadline - clock.now, .milliseconds(1)))
            }
            try await link.waitForServices(until: deadline)
        } catch {
            await link.disconnect()
            if error is BlueZLink.EndedWhileResolving { throw error }
            switch BlueZ.radioError(error) {
            case .timedOut: throw RadioError.timedOut
            case .stack(let name, let message): throw RadioError.connectionFailed("\(name): \(message)")
            case let other: throw other
            }
        }
        return link
    }

}

/// One connection to a box, through its `Device1` object and the GATT objects under it.
final class BlueZLink: CentralLink, @unchecked Sendable {
    let peer: DeviceAddress
    let events: AsyncStream<LinkEvent>
    private let central: BlueZCentral
    private let path: String
    private let continuation: AsyncStream<LinkEvent>.Continuation
    private let state = NIOLockedValueBox<(subscribed: [String: String], local: Bool, ended: Bool, resolved: Bool)>(([:], false, false, false))
    private let resolvedSignal = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
    private var watcher: Task<Void, Never>?

    init(central: BlueZCentral, peer: DeviceAddress, path: String) {
        self.central = central
        self.peer = peer
        self.path = path
        (events, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        let changes = central.objects.changes()
        watcher = Task { [weak self] in
            for await change in changes {
                guard let self else { return }
                if self.handle(change) { return }
            }
        }
    }

    deinit { watcher?.cancel() }

    /// Returns true once the link has ended.
    private func handle(_ change: BlueZObjects.Change) -> Bool {
        switch change {
        case .changed(let p, BlueZ.gattCharacteristic, let props) where p.hasPrefix(path + "/"):
            if let value = props["Value"]?.bytes, let uuid = state.withLockedValue({ $0.subscribed[p] }) {
                continuation.yield(.notification(characteristic: uuid, value: value))
            }
        case .changed(path, BlueZ.device, let props):
            if props["ServicesResolved"]?.bool == true { resolvedSignal.continuation.yield() }
            if props["Connected"]?.bool == false { end(.remoteUser); return true }
        case .removed(path, let interfaces) where interfaces.contains(BlueZ.device):
            end(.remoteUser); return true
        case .service(present: false):
            end(.radioOff); return true
        case .changed(central.adapter.path, BlueZ.adapter, let props) where props["Powered"]?.bool == false:
            end(.radioOff); return true
        default:
            break
        }
        return false
    }

    private func end(_ reason: DisconnectReason) {
        let local = state.withLockedValue { s -> Bool? in
            guard !s.ended else { return nil }
            s.ended = true
            return s.local
        }
        guard let local else { return }
        continuation.yield(.disconnected(local ? .localHost : reason))
        continuation.finish()
        resolvedSignal.continuation.finish()
    }

    /// The link ended before BlueZ resolved its services; `BlueZCentral.connect` tries again.
    enum EndedWhileResolving: Error { case ended }

    func waitForServices(until deadline: Duration) async throws {
        let clock = MonotonicClock()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { [self] in
                var signals = resolvedSignal.stream.makeAsyncIterator()
                while central.objects.properties(path, BlueZ.device)?["ServicesResolved"]?.bool != true {
                    guard await signals.next() != nil else { throw EndedWhileResolving.ended }
                }
            }
            group.addTask {
                try await clock.sleep(until: deadline)
                throw RadioError.timedOut
            }
            try await group.next()
            group.cancelAll()
        }
    }

    var mtu: Int {
        get async {
            // BlueZ 5.62+ shows the exchanged ATT MTU on every remote characteristic. It can
            // change after ServicesResolved without a signal we rely on, so ask.
            let characteristics = central.objects.objects(with: BlueZ.gattCharacteristic, under: path + "/")
            if let any = characteristics.keys.sorted().first,
               let reply = try? await central.bus.call(BlueZ.service, any, "org.freedesktop.DBus.Properties", "Get",
                                                      [.string(BlueZ.gattCharacteristic), .string("MTU")], timeout: .seconds(2)),
               let value = reply.first?.int, value >= 23 {
                return value
            }
            return characteristics.values.lazy.compactMap { $0["MTU"]?.int }.first ?? 23
        }
    }

    func discover(service uuid: String) async throws -> GATTService {
        let wanted = uuid.lowercased()
        /// The service's path, once it and its characteristics are known here.
        func find() -> String? {
            guard let service = central.objects.objects(with: BlueZ.gattService, under: path + "/")
                    .first(where: { $0.value["UUID"]?.string?.lowercased() == wanted })?.key else { return nil }
            let hasCharacteristics = central.objects.objects(with: BlueZ.gattCharacteristic, under: service + "/")
                .contains { $0.value["Service"]?.string == service }
            return hasCharacteristics ? service : nil
        }
        // The service's objects can reach this process a moment after ServicesResolved (seen
        // in the lab under load as serviceNotFound, and against bluezoo as characteristicNotFound,
        // on a box that had both): look again for up to a second before calling it missing.
        var found = find()
        for _ in 0..<10 where found == nil {
            try await Task.sleep(for: .milliseconds(100))
            try? await central.objects.reload()  // ask bluetoothd, in case a signal was missed
            found = find()
        }
        guard let servicePath = found ?? central.objects.objects(with: BlueZ.gattService, under: path + "/")
                .first(where: { $0.value["UUID"]?.string?.lowercased() == wanted })?.key else { throw RadioError.serviceNotFound(uuid) }
        let characteristics = central.objects.objects(with: BlueZ.gattCharacteristic, under: servicePath + "/")
            .filter { $0.value["Service"]?.string == servicePath }
            .sorted { $0.key < $1.key }
            .map { _, props in
                let flags = Set(props["Flags"]?.strings ?? [])
                var p: CharacteristicProperties = []
                if flags.contains("read") { p.insert(.read) }
                if flags.contains("write") { p.insert(.write) }
                if flags.contains("write-without-response") { p.insert(.writeWithoutResponse) }
                if flags.contains("notify") { p.insert(.notify) }
                return GATTCharacteristic(uuid: props["UUID"]?.string ?? "", properties: p)
            }
        return GATTService(uuid: wanted, characteristics: characteristics)
    }

    private func characteristicPath(_ uuid: String) throws -> String {
        let wanted = uuid.lowercased()
        guard let p = central.objects.objects(with: BlueZ.gattCharacteristic, under: path + "/")
                .first(where: { $0.value["UUID"]?.string?.lowercased() == wanted })?.key else {
            throw RadioError.characteristicNotFound(uuid)
        }
        return p
    }

    private func call(_ characteristic: String, _ member: String, _ arguments: [DBusValue],
                      sent: (@Sendable () -> Void)? = nil) async throws -> [DBusValue] {
        guard !state.withLockedValue({ $0.ended }) else { sent?(); throw RadioError.notConnected }
        let p: String
        do { p = try characteristicPath(characteristic) } catch { sent?(); throw error }
        do {
            return try await central.bus.call(BlueZ.service, p, BlueZ.gattCharacteristic, member, arguments, timeout: .seconds(10), sent: sent)
        } catch {
            throw BlueZ.radioError(error)
        }
    }

    func read(_ characteristic: String) async throws -> [UInt8] {
        guard let value = try await call(characteristic, "ReadValue", [.vardict([:])]).first?.bytes else {
            throw RadioError.stack(name: "org.bluez.Error.Failed", message: "ReadValue returned no bytes")
        }
        return value
    }

    func write(_ characteristic: String, value: [UInt8], withResponse: Bool) async throws {
        let limit = await mtu - 3
        guard value.count <= limit else { throw RadioError.invalidLength(length: value.count, limit: limit) }
        _ = try await call(characteristic, "WriteValue", [.bytes(value), .vardict(["type": .string(withResponse ? "request" : "command")])])
    }

    func subscribe(_ characteristic: String) async throws {
        let p = try characteristicPath(characteristic)
        state.withLockedValue { $0.subscribed[p] = characteristic.lowercased() }
        _ = try await call(characteristic, "StartNotify", [])
    }

    /// StartNotify, then the fragments' WriteValue calls as commands, not after StartNotify's
    /// reply (the CCCD's round trip) but after one quick D-Bus round trip to bluetoothd. That
    /// one is for the order on the air: bluetoothd's ATT queue sends queued commands ahead of a
    /// queued request, so commands dispatched with StartNotify would overtake the CCCD's Write
    /// Request. bluetoothd dispatches D-Bus messages at idle priority, so by the time a message
    /// sent after the round trip is dispatched, its main loop has written the queued CCCD
    /// request. Nothing promises that; the box holds its answer until it sees a subscription,
    /// and the phone sends message 1 again if the answer is lost (BoxLink).
    func subscribe(_ characteristic: String, thenWrite target: String, fragments: [[UInt8]]) async throws {
        let limit = await mtu - 3
        if let long = fragments.first(where: { $0.count > limit }) { throw RadioError.invalidLength(length: long.count, limit: limit) }
        let p = try characteristicPath(characteristic)
        state.withLockedValue { $0.subscribed[p] = characteristic.lowercased() }
        // `sent` runs exactly once, on every path (the call made or failed), so the wait below
        // ends; a continuation, not a stream, so cancellation cannot end it early and reorder.
        let handedOver = NIOLockedValueBox<(sent: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))
        async let subscription: Void = { _ = try await call(characteristic, "StartNotify", [], sent: {
            let waiter = handedOver.withLockedValue { h -> CheckedContinuation<Void, Never>? in
                h.sent = true
                defer { h.waiter = nil }
                return h.waiter
            }
            waiter?.resume()
        }) }()
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let sent = handedOver.withLockedValue { h -> Bool in
                if !h.sent { h.waiter = c }
                return h.sent
            }
            if sent { c.resume() }
        }
        var failure: (any Error)?
        do {
            try Task.checkCancellation()
            _ = try? await central.bus.call(BlueZ.service, p, "org.freedesktop.DBus.Properties", "Get",
                                            [.string(BlueZ.gattCharacteristic), .string("Notifying")], timeout: .seconds(2))
            for value in fragments {
                _ = try await call(target, "WriteValue", [.bytes(value), .vardict(["type": .string("command")])])
            }
        } catch { failure = error }
        let subscribed: Result<Void, any Error>
        do { try await subscription; subscribed = .success(()) } catch { subscribed = .failure(error) }
        // A write's error says more (the link went) than the subscription's that follows it.
        if let failure { throw failure }
        try subscribed.get()
    }

    func unsubscribe(_ characteristic: String) async throws {
        let p = try characteristicPath(characteristic)
        _ = try await call(characteristic, "StopNotify", [])
        state.withLockedValue { _ = $0.subscribed.removeValue(forKey: p) }
    }

    func rssi() async throws -> Int {
        try BlueZ.readRSSI(adapter: central.adapter, peer: peer)
    }

    func disconnect() async {
        let already = state.withLockedValue { s -> Bool in s.local = true; return s.ended }
        guard !already else { return }
        _ = try? await central.bus.call(BlueZ.service, path, BlueZ.device, "Disconnect", timeout: .seconds(5))
        // Done only once BlueZ says so: a connect right after this (pairing, then a login)
        // would otherwise find the old link still up and lose it a moment later.
        await central.objects.waitUntilDisconnected(path, until: MonotonicClock().now + .seconds(5))
    }
}
