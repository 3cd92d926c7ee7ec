import BoxkeyDBus
import BoxkeyRadio
import NIOConcurrencyHelpers

/// The box's radio through BlueZ: a GATT application (`GattManager1.RegisterApplication`) and
/// an LE advertisement (`LEAdvertisingManager1.RegisterAdvertisement`) exported on the system
/// bus, connections seen through `Device1.Connected`.
///
/// BlueZ's GATT server API says which device wrote (the `device` option) but not which device
/// subscribed, and sends a characteristic's notifications to every subscribed device. So a
/// central counts as subscribed once notifications are on and it has written; Boxkey's phone
/// always subscribes before its first write.
public final class BlueZPeripheral: PeripheralRadio, @unchecked Sendable {
    public let address: DeviceAddress
    public let events: AsyncStream<PeripheralEvent>
    public let adapter: BlueZAdapter

    private struct Central {
        let id: CentralID
        var subscribed: Set<String> = []
        var notified: ContinuousClock.Instant?
    }

    private struct State {
        var centrals: [String: Central] = [:]
        var nextConnection: UInt64 = 0
        var notifying: Set<String> = []
        var service: GATTService?
        var applicationRegistered = false
        var advertising: AdvertisingData?
        var advertisementRegistered = false
        /// A re-registration after a connection is running (`advertiseAgain`), and another is due.
        var readvertising = false
        var readvertiseWanted = false
        var localDisconnects: Set<String> = []
        var reasons: [String: DisconnectReason] = [:]
    }

    static let applicationRoot = "/org/boxkey/gatt"
    static let advertisementPath = "/org/boxkey/advertisement0"

    private let objects: BlueZObjects
    private let bus: DBusConnection
    private let application: DBusObjectTree
    private let advertisement: DBusObjectTree
    private let continuation: AsyncStream<PeripheralEvent>.Continuation
    private let state = NIOLockedValueBox(State())
    private let watcher = NIOLockedValueBox<Task<Void, Never>?>(nil)

    /// Opens BlueZ on `adapterName` (or the first adapter). Throws `RadioError.unavailable`
    /// when bluetoothd is not running or has no such adapter.
    public init(adapter adapterName: String? = nil, bus busKind: DBusConnection.Bus = .system) async throws {
        (bus, objects, adapter) = try await BlueZ.open(adapter: adapterName, bus: busKind)
        address = adapter.address
        application = DBusObjectTree(connection: bus, root: Self.applicationRoot)
        advertisement = DBusObjectTree(connection: bus, root: Self.advertisementPath)
        (events, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        let changes = objects.changes()
        watcher.withLockedValue { $0 = Task { [weak self] in for await c in changes { await self?.handle(c) } } }
        // Centrals that connected before we started.
        for (path, props) in objects.objects(with: BlueZ.device, under: adapter.path + "/") where props["Connected"]?.bool == true {
            centralConnected(path, props)
        }
    }

    /// Unregisters everything and closes the bus connection.
    public func close() async {
        await stopAdvertising()
        if state.withLockedValue({ $0.applicationRegistered }) {
            _ = try? await bus.call(BlueZ.service, adapter.path, BlueZ.gattManager, "UnregisterApplication",
                                    [.objectPath(Self.applicationRoot)], timeout: .seconds(2))
        }
        watcher.withLockedValue { $0?.cancel() }
        objects.close()
        continuation.finish()
        bus.close()
    }

    // MARK: GATT application

    public func setValue(_ value: [UInt8], of characteristic: String) async {
        // ReadValue reads the service from the state at each request.
        state.withLockedValue { $0.service?.setValue(value, of: characteristic) }
    }

    public func publish(_ service: GATTService) async throws {
        let wasRegistered = state.withLockedValue { s -> Bool in
            s.service = service
            defer { s.applicationRegistered = false }
            return s.applicationRegistered
        }
        if wasRegistered {
            _ = try? await bus.call(BlueZ.service, adapter.path, BlueZ.gattManager, "UnregisterApplication", [.objectPath(Self.applicationRoot)])
        }
        application.remove(under: Self.applicationRoot + "/service0")
        let servicePath = Self.applicationRoot + "/service0"
        application.add(Self.applicationRoot, [DBusObjectTree.objectManagerInterface: .init()])
        application.add(servicePath, [BlueZ.gattService: .init(properties: [
            "UUID": .string(service.uuid), "Primary": .bool(true),
        ])])
        for (index, c) in service.characteristics.enumerated() {
            let named: [(CharacteristicProperties, String)] = [(.read, "read"), (.write, "write"), (.writeWithoutResponse, "write-without-response"), (.notify, "notify")]
            let flags = named.filter { c.properties.contains($0.0) }.map(\.1)
            var properties: [String: DBusValue] = ["UUID": .string(c.uuid), "Service": .objectPath(servicePath), "Flags": .strings(flags)]
            if c.properties.contains(.notify) { properties["Notifying"] = .bool(false) }
            let path = servicePath + "/char\(index)"
            let uuid = c.uuid
            application.add(path, [BlueZ.gattCharacteristic: .init(properties: properties, methods: [
                "ReadValue": { [weak self] call in self?.readValue(uuid, call) ?? .empty },
                "WriteValue": { [weak self] call in self?.writeValue(uuid, call) ?? .empty },
                "StartNotify": { [weak self] _ in self?.notifications(uuid, path: path, on: true); return .empty },
                "StopNotify": { [weak self] _ in self?.notifications(uuid, path: path, on: false); return .empty },
                // Indication confirmations; Boxkey only notifies, so there is nothing to confirm.
                "Confirm": { _ in .empty },
            ])])
        }
        try await registerApplication()
    }

    private func registerApplication() async throws {
        try await register(BlueZ.gattManager, "RegisterApplication", Self.applicationRoot, done: \.applicationRegistered)
    }

    private func registerAdvertisement() async throws {
        try await register(BlueZ.advertisingManager, "RegisterAdvertisement", Self.advertisementPath, done: \.advertisementRegistered)
    }

    /// Registers an exported object with one of the adapter's managers, retrying while BlueZ
    /// is busy, and records that it is registered.
    private func register(_ manager: String, _ member: String, _ path: String, done: WritableKeyPath<State, Bool>) async throws {
        do {
            try await BlueZ.retrying {
                _ = try await bus.call(BlueZ.service, adapter.path, manager, member, [.objectPath(path), .vardict([:])], timeout: .seconds(10))
            }
            state.withLockedValue { $0[keyPath: done] = true }
        } catch let error as BusError where error.name == "org.bluez.Error.AlreadyExists" {
            // Registered by a call that overlapped this one (advertiseAgain and a new nonce).
            state.withLockedValue { $0[keyPath: done] = true }
        } catch {
            throw BlueZ.radioError(error)
        }
    }

    private func readValue(_ uuid: String, _ call: DBusMessage) -> DBusReply {
        guard let c = state.withLockedValue({ $0.service?.characteristic(uuid) }), c.properties.contains(.read), let value = c.value else {
            return .error(BusError("org.bluez.Error.NotPermitted", "not readable"))
        }
        let offset = call.arguments.first?.vardict?["offset"]?.int ?? 0
        guard offset <= value.count else { return .error(BusError("org.bluez.Error.InvalidOffset", "offset \(offset)")) }
        return .values([.bytes(Array(value[offset...]))])
    }

    /// Runs on the D-Bus thread: events are yielded in the order BlueZ called.
    private func writeValue(_ uuid: String, _ call: DBusMessage) -> DBusReply {
        guard call.arguments.count == 2, let value = call.arguments[0].bytes, let options = call.arguments[1].vardict else {
            return .error(BusError("org.bluez.Error.InvalidArguments", "expected (ay, a{sv})"))
        }
        guard let device = options["device"]?.string else {
            return .error(BusError("org.bluez.Error.InvalidArguments", "no device option"))
        }
        // bluetoothd checks an attribute's permissions only when it has some: a notify-only
        // characteristic has none, so a write to it reaches us and is refused here (ATT error
        // Write Not Permitted).
        guard let c = state.withLockedValue({ $0.service?.characteristic(uuid) }), !c.properties.isDisjoint(with: [.write, .writeWithoutResponse]) else {
            return .error(BusError("org.bluez.Error.NotPermitted", "not writable"))
        }
        let mtu = options["mtu"]?.int ?? 23
        var pending: [PeripheralEvent] = []
        state.withLockedValue { s in
            if s.centrals[device] == nil {
                guard let a = objects.properties(device, BlueZ.device)?["Address"]?.string.flatMap(DeviceAddress.init)
                        ?? Self.address(fromDevicePath: device) else { return }
                s.nextConnection += 1
                s.centrals[device] = Central(id: CentralID(address: a, connection: s.nextConnection))
                pending.append(.connected(s.centrals[device]!.id, mtu: mtu))
            }
            let id = s.centrals[device]!.id
            for n in s.notifying where !s.centrals[device]!.subscribed.contains(n) {
                s.centrals[device]!.subscribed.insert(n)
                pending.append(.subscribed(id, characteristic: n))
            }
            pending.append(.wrote(id, characteristic: uuid, value: value, mtu: mtu))
        }
        for e in pending { continuation.yield(e) }
        return .empty
    }

    private func notifications(_ uuid: String, path: String, on: Bool) {
        var pending: [PeripheralEvent] = []
        state.withLockedValue { s in
            if on { s.notifying.insert(uuid) } else { s.notifying.remove(uuid) }
            for (device, c) in s.centrals where c.subscribed.contains(uuid) != on {
                if on { s.centrals[device]!.subscribed.insert(uuid) } else { s.centrals[device]!.subscribed.remove(uuid) }
                pending.append(on ? .subscribed(c.id, characteristic: uuid) : .unsubscribed(c.id, characteristic: uuid))
            }
        }
        application.set(path, BlueZ.gattCharacteristic, "Notifying", .bool(on))
        for e in pending { continuation.yield(e) }
    }

    public func notify(_ central: CentralID, characteristic: String, value: [UInt8]) async throws {
        let path = try state.withLockedValue { s -> String in
            guard let (device, c) = s.centrals.first(where: { $0.value.id == central }) else { throw RadioError.notConnected }
            guard c.subscribed.contains(characteristic.lowercased()),
                  let index = s.service?.characteristics.firstIndex(where: { $0.uuid == characteristic.lowercased() }) else {
                throw RadioError.notPermitted("\(central) has not subscribed to \(characteristic)")
            }
            s.centrals[device]!.notified = .now
            return Self.applicationRoot + "/service0/char\(index)"
        }
        // BlueZ sends a notification for each PropertiesChanged of Value.
        application.set(path, BlueZ.gattCharacteristic, "Value", .bytes(value))
    }

    // MARK: Advertising

    public func advertise(_ data: AdvertisingData) async throws {
        var properties: [String: DBusValue] = [
            "Type": .string("peripheral"),
            "ServiceUUIDs": .strings(data.serviceUUIDs),
            // The LE General Discoverable flag: without it BlueZ's discovery ignores the box.
            "Discoverable": .bool(true),
            "ManufacturerData": .dict(keySignature: "q", valueSignature: "v",
                                      data.manufacturerData.keys.sorted().map { (.uint16($0), .variant(.bytes(data.manufacturerData[$0]!))) }),
        ]
        let ms = UInt32(data.interval.components.seconds * 1000 + data.interval.components.attoseconds / 1_000_000_000_000_000)
        // Honoured by bluetoothd with experimental features (-E) before 5.77, ignored otherwise.
        properties["MinInterval"] = .uint32(ms)
        properties["MaxInterval"] = .uint32(ms)
        if let name = data.localName { properties["LocalName"] = .string(name) }
        let registered = state.withLockedValue { s -> Bool in s.advertising = data; return s.advertisementRegistered }
        if registered {
            // Same advertisement, new data (the nonce rotates): bluetoothd re-reads changed properties.
            for key in ["ServiceUUIDs", "ManufacturerData"] where advertisement.property(Self.advertisementPath, BlueZ.advertisement, key) != properties[key] {
                advertisement.set(Self.advertisementPath, BlueZ.advertisement, key, properties[key]!)
            }
            return
        }
        advertisement.add(Self.advertisementPath, [BlueZ.advertisement: .init(properties: properties, methods: [
            "Release": { [weak self] _ in
                self?.state.withLockedValue { $0.advertisementRegistered = false }
                return .empty
            },
        ])])
        try await registerAdvertisement()
    }

    public func stopAdvertising() async {
        let registered = state.withLockedValue { s -> Bool in
            s.advertising = nil
            defer { s.advertisementRegistered = false }
            return s.advertisementRegistered
        }
        if registered {
            _ = try? await bus.call(BlueZ.service, adapter.path, BlueZ.advertisingManager, "UnregisterAdvertisement",
                                    [.objectPath(Self.advertisementPath)], timeout: .seconds(5))
        }
        advertisement.remove(under: Self.advertisementPath)
    }

    // MARK: Links

    public func rssi(of central: CentralID) async throws -> Int {
        try BlueZ.readRSSI(adapter: adapter, peer: central.address)
    }

    public func disconnect(_ central: CentralID) async {
        // bluetoothd queues a notification but carries out Disconnect at once: a refusal just
        // sent would not reach the phone (seen in the lab). Two connection events let it out.
        if let notified = state.withLockedValue({ $0.centrals.values.first { $0.id == central }?.notified }) {
            try? await Task.sleep(until: notified + .milliseconds(100), clock: .continuous)
        }
        guard let path = state.withLockedValue({ s -> String? in
            let p = s.centrals.first { $0.value.id == central }?.key
            if let p { s.localDisconnects.insert(p) }
            return p
        }) else { return }
        _ = try? await bus.call(BlueZ.service, path, BlueZ.device, "Disconnect", timeout: .seconds(5))
    }

    private func centralConnected(_ path: String, _ props: [String: DBusValue]) {
        // A bonded device connected to this adapter is most likely one the box itself uses
        // (keyboard, mouse); phones do not pair. It still counts as a central once it writes.
        guard props["Paired"]?.bool != true, let a = props["Address"]?.string.flatMap(DeviceAddress.init) else { return }
        let id = state.withLockedValue { s -> CentralID? in
            guard s.centrals[path] == nil else { return nil }
            s.nextConnection += 1
            s.centrals[path] = Central(id: CentralID(address: a, connection: s.nextConnection))
            return s.centrals[path]!.id
        }
        guard let id else { return }
        continuation.yield(.connected(id, mtu: 23))
        Task { await advertiseAgain() }
    }

    /// Advertising stops when a central connects (the controller ends connectable advertising,
    /// and the kernel restarts it only at the next disconnection), so while one phone holds
    /// its presence link no other could find the box. Registering the advertisement again
    /// starts it again; the box still turns away connections over its `max_connections`.
    /// One re-registration at a time: connections that arrive meanwhile share the next one.
    private func advertiseAgain() async {
        let first = state.withLockedValue { s -> Bool in
            guard s.advertising != nil else { return false }
            s.readvertiseWanted = true
            guard !s.readvertising else { return false }
            s.readvertising = true
            return true
        }
        guard first else { return }
        while state.withLockedValue({ s -> Bool in
            guard s.readvertiseWanted, s.advertising != nil, s.advertisementRegistered else { return false }
            s.readvertiseWanted = false
            return true
        }) {
            _ = try? await bus.call(BlueZ.service, adapter.path, BlueZ.advertisingManager, "UnregisterAdvertisement",
                                    [.objectPath(Self.advertisementPath)], timeout: .seconds(5))
            // stopAdvertising may have run meanwhile; then it stays unregistered.
            guard state.withLockedValue({ s -> Bool in
                guard s.advertising != nil else { return false }
                s.advertisementRegistered = false
                return true
            }) else { break }
            await reregister()
        }
        state.withLockedValue { $0.readvertising = false }
    }

    private func centralGone(_ path: String, reason fallback: DisconnectReason) {
        guard let (c, reason) = state.withLockedValue({ s -> (Central, DisconnectReason)? in
            guard let c = s.centrals.removeValue(forKey: path) else { return nil }
            let reason = s.localDisconnects.remove(path) != nil ? .localHost : (s.reasons.removeValue(forKey: path) ?? fallback)
            return (c, reason)
        }) else { return }
        continuation.yield(.disconnected(c.id, reason: reason))
    }

    private func allCentralsGone(_ reason: DisconnectReason) {
        for path in state.withLockedValue({ Array($0.centrals.keys) }) { centralGone(path, reason: reason) }
    }

    private func handle(_ change: BlueZObjects.Change) async {
        let prefix = adapter.path + "/"
        switch change {
        case .added(let path, let interfaces) where path.hasPrefix(prefix) && interfaces.contains(BlueZ.device):
            if let props = objects.properties(path, BlueZ.device), props["Connected"]?.bool == true { centralConnected(path, props) }
        case .changed(let path, BlueZ.device, let props) where path.hasPrefix(prefix):
            switch props["Connected"]?.bool {
            case true?: if let all = objects.properties(path, BlueZ.device) { centralConnected(path, all) }
            case false?: centralGone(path, reason: .remoteUser)
            case nil: break
            }
        case .removed(let path, let interfaces) where interfaces.contains(BlueZ.device):
            centralGone(path, reason: .remoteUser)
        case .signal(let m) where m.member == "Disconnected" && (m.path ?? "").hasPrefix(prefix):
            // BlueZ 5.73+: Device1.Disconnected(reason name, message) before Connected goes false.
            let name = m.arguments.first?.string ?? ""
            let reason: DisconnectReason = name.hasSuffix("Timeout") ? .supervisionTimeout : name.hasSuffix("Local") ? .localHost : .remoteUser
            state.withLockedValue { $0.reasons[m.path!] = reason }
        case .changed(adapter.path, BlueZ.adapter, let props) where props["Powered"]?.bool == false:
            allCentralsGone(.radioOff)
        case .removed(adapter.path, let interfaces) where interfaces.contains(BlueZ.adapter):
            allCentralsGone(.radioOff)
            state.withLockedValue { $0.applicationRegistered = false; $0.advertisementRegistered = false }
        case .added(adapter.path, let interfaces) where interfaces.contains(BlueZ.adapter):
            await reregister()
        case .service(present: false):
            allCentralsGone(.radioOff)
            state.withLockedValue { $0.applicationRegistered = false; $0.advertisementRegistered = false }
        case .service(present: true):
            // bluetoothd restarted: everything registered with the old one is gone.
            try? await Task.sleep(for: .milliseconds(200))
            try? await objects.reload()
            await reregister()
        default:
            break
        }
    }

    /// Registers the application and advertisement again, retrying until bluetoothd takes them.
    private func reregister() async {
        var delay = Duration.milliseconds(250)
        while !Task.isCancelled {
            let (service, advertising, appDone, advDone) = state.withLockedValue { ($0.service, $0.advertising, $0.applicationRegistered, $0.advertisementRegistered) }
            do {
                if service != nil, !appDone { try await registerApplication() }
                if advertising != nil, !advDone { try await registerAdvertisement() }
                return
            } catch {
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(5))
            }
        }
    }

    static func address(fromDevicePath path: String) -> DeviceAddress? {
        guard let last = path.split(separator: "/").last, last.hasPrefix("dev_") else { return nil }
        return DeviceAddress(last.dropFirst(4).split(separator: "_").joined(separator: ":"))
    }
}
