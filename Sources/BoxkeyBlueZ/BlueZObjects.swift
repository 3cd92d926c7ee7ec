import BoxkeyDBus
import BoxkeyRadio
import CBoxkeyHCI
import NIOConcurrencyHelpers

/// BlueZ's names.
enum BlueZ {
    static let service = "org.bluez"
    static let adapter = "org.bluez.Adapter1"
    static let device = "org.bluez.Device1"
    static let gattManager = "org.bluez.GattManager1"
    static let gattService = "org.bluez.GattService1"
    static let gattCharacteristic = "org.bluez.GattCharacteristic1"
    static let advertisingManager = "org.bluez.LEAdvertisingManager1"
    static let advertisement = "org.bluez.LEAdvertisement1"

    /// `/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF`
    static func devicePath(adapter: String, _ address: DeviceAddress) -> String {
        adapter + "/dev_" + address.string.split(separator: ":").joined(separator: "_")
    }

    /// Errors worth retrying after a pause: the adapter is busy or still starting.
    static func isTransient(_ error: any Error) -> Bool {
        guard let e = error as? BusError else { return false }
        return e.name == "org.bluez.Error.InProgress" || e.name == "org.bluez.Error.NotReady"
            || (e.name == "org.bluez.Error.Failed" && e.message.contains("abort"))
    }

    /// Runs `body`, retrying transient BlueZ errors with backoff (50 ms doubling, `attempts` tries).
    static func retrying<T: Sendable>(attempts: Int = 6, _ body: () async throws -> T) async throws -> T {
        var delay = Duration.milliseconds(50)
        for _ in 1..<attempts {
            do { return try await body() } catch where isTransient(error) {
                try await Task.sleep(for: delay)
                delay *= 2
            }
        }
        return try await body()
    }

    /// A bus connection, BlueZ's object tree on it, and the chosen adapter: what both roles
    /// start from. Throws `RadioError.unavailable` when bluetoothd or the adapter is missing.
    static func open(adapter name: String?, bus kind: DBusConnection.Bus) async throws -> (DBusConnection, BlueZObjects, BlueZAdapter) {
        let bus: DBusConnection
        do { bus = try DBusConnection(kind) } catch { throw RadioError.unavailable("cannot reach the system bus: \(error)") }
        do {
            let objects = try await BlueZObjects(bus: bus)
            return (bus, objects, try await BlueZAdapter.choose(name, in: objects))
        } catch {
            bus.close()
            throw radioError(error)
        }
    }

    /// The RSSI of a connected link: BlueZ's D-Bus API has none, so HCI Read RSSI.
    static func readRSSI(adapter: BlueZAdapter, peer: DeviceAddress) throws -> Int {
        var value: Int8 = 0
        let result = boxkey_hci_read_rssi(adapter.name, peer.string, &value)
        guard result == 0 else { throw RadioError.stack(name: "HCI Read RSSI", message: "errno \(-result)") }
        return Int(value)
    }

    static func radioError(_ error: any Error) -> RadioError {
        if let e = error as? RadioError { return e }
        if let e = error as? BusError {
            switch e.name {
            case BusError.serviceUnknownName, "org.freedesktop.DBus.Error.NameHasNoOwner", BusError.disconnectedName:
                return .unavailable("bluetoothd is not running (\(e.message))")
            case BusError.noReplyName: return .timedOut
            case "org.bluez.Error.NotConnected": return .notConnected
            case "org.bluez.Error.NotPermitted", "org.bluez.Error.NotAuthorized": return .notPermitted(e.message)
            case "org.bluez.Error.InvalidValueLength": return .invalidLength(length: 0, limit: 0)
            default: return .stack(name: e.name, message: e.message)
            }
        }
        return .stack(name: "\(type(of: error))", message: "\(error)")
    }
}

/// A mirror of BlueZ's object tree (`GetManagedObjects`, kept current from `InterfacesAdded`,
/// `InterfacesRemoved` and `PropertiesChanged`), with a stream of changes per listener.
///
/// Signals are subscribed before the tree is read, so nothing falls between the two.
final class BlueZObjects: Sendable {
    typealias Interfaces = [String: [String: DBusValue]]

    enum Change: Sendable {
        case added(path: String, interfaces: [String])
        case removed(path: String, interfaces: [String])
        case changed(path: String, interface: String, properties: [String: DBusValue])
        /// bluetoothd went away (`present == false`) or came (back); registrations are gone then.
        case service(present: Bool)
        /// A signal on a Device1 or GattCharacteristic1 that is not a property change (for
        /// example BlueZ 5.73's `Device1.Disconnected(reason, message)`).
        case signal(DBusMessage)
    }

    let bus: DBusConnection
    private let state = NIOLockedValueBox<(objects: [String: Interfaces], listeners: [UInt64: AsyncStream<Change>.Continuation], next: UInt64)>(([:], [:], 0))
    private let pump: NIOLockedValueBox<Task<Void, Never>?> = NIOLockedValueBox(nil)

    init(bus: DBusConnection) async throws {
        self.bus = bus
        // Every signal of bluetoothd's in one stream, applied in the order it sent them: a
        // link's GATT objects (InterfacesAdded) are in the mirror before the ServicesResolved
        // that follows them. (Three streams, one per kind, applied in any order between
        // them: a phone was told its services were resolved before it saw them, seen over
        // bluezoo as characteristicNotFound.)
        let bluez = try await bus.signals(SignalMatch(sender: BlueZ.service))
        let owner = try await bus.signals(SignalMatch(sender: "org.freedesktop.DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged"))
        try? await reload()
        let task = Task { [weak self] in
            await withTaskGroup(of: Void.self) { group in
                for stream in [bluez, owner] {
                    group.addTask { for await m in stream { self?.apply(m) } }
                }
            }
        }
        pump.withLockedValue { $0 = task }
    }

    func close() {
        pump.withLockedValue { $0?.cancel(); $0 = nil }
        // Finished outside the lock: a listener's onTermination takes it.
        let listeners = state.withLockedValue { s in defer { s.listeners = [:] }; return Array(s.listeners.values) }
        for l in listeners { l.finish() }
    }

    /// Reads the whole tree again (at start and when bluetoothd comes back).
    func reload() async throws {
        let reply = try await bus.call(BlueZ.service, "/", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects", timeout: .seconds(5))
        var objects: [String: Interfaces] = [:]
        for (path, interfaces) in reply.first?.entries ?? [] {
            guard let p = path.string else { continue }
            var i: Interfaces = [:]
            for (name, props) in interfaces.entries ?? [] {
                if let n = name.string { i[n] = props.vardict ?? [:] }
            }
            objects[p] = i
        }
        state.withLockedValue { $0.objects = objects }
    }

    /// Changes from now on, in order, until the listener stops iterating.
    func changes() -> AsyncStream<Change> {
        let (stream, continuation) = AsyncStream<Change>.makeStream()
        let id = state.withLockedValue { s -> UInt64 in
            s.next += 1
            s.listeners[s.next] = continuation
            return s.next
        }
        continuation.onTermination = { [weak self] _ in _ = self?.state.withLockedValue { $0.listeners.removeValue(forKey: id) } }
        return stream
    }

    func properties(_ path: String, _ interface: String) -> [String: DBusValue]? {
        state.withLockedValue { $0.objects[path]?[interface] }
    }

    func isConnected(_ devicePath: String) -> Bool {
        properties(devicePath, BlueZ.device)?["Connected"]?.bool == true
    }

    /// Waits (polling the mirror) until BlueZ says the device is disconnected, or `deadline`.
    func waitUntilDisconnected(_ devicePath: String, until deadline: Duration) async {
        let clock = MonotonicClock()
        while isConnected(devicePath), clock.now < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Every object carrying `interface`, by path.
    func objects(with interface: String, under prefix: String = "/") -> [String: [String: DBusValue]] {
        state.withLockedValue { s in
            var out: [String: [String: DBusValue]] = [:]
            for (path, interfaces) in s.objects where path.hasPrefix(prefix) {
                if let props = interfaces[interface] { out[path] = props }
            }
            return out
        }
    }

    private func apply(_ m: DBusMessage) {
        var change: Change?
        switch m.member {
        case "InterfacesAdded":
            guard m.arguments.count == 2, let path = m.arguments[0].string, let interfaces = m.arguments[1].entries else { return }
            var names: [String] = []
            state.withLockedValue { s in
                for (name, props) in interfaces {
                    guard let n = name.string else { continue }
                    names.append(n)
                    s.objects[path, default: [:]][n] = props.vardict ?? [:]
                }
            }
            change = .added(path: path, interfaces: names)
        case "InterfacesRemoved":
            guard m.arguments.count == 2, let path = m.arguments[0].string, let names = m.arguments[1].strings else { return }
            state.withLockedValue { s in
                for n in names { s.objects[path]?[n] = nil }
                if s.objects[path]?.isEmpty == true { s.objects[path] = nil }
            }
            change = .removed(path: path, interfaces: names)
        case "PropertiesChanged":
            guard m.arguments.count >= 2, let path = m.path, let interface = m.arguments[0].string, let props = m.arguments[1].vardict else { return }
            let invalidated = m.arguments.count > 2 ? (m.arguments[2].strings ?? []) : []
            state.withLockedValue { s in
                guard s.objects[path]?[interface] != nil else { return }
                for (k, v) in props { s.objects[path]![interface]![k] = v }
                for k in invalidated { s.objects[path]![interface]![k] = nil }
            }
            change = .changed(path: path, interface: interface, properties: props)
        case "NameOwnerChanged":
            guard m.arguments.count == 3, m.arguments[0].string == BlueZ.service else { return }
            let present = !(m.arguments[2].string ?? "").isEmpty
            if !present { state.withLockedValue { $0.objects = [:] } }
            change = .service(present: present)
        default:
            if m.interface == BlueZ.device { change = .signal(m) }
        }
        guard let change else { return }
        let listeners = state.withLockedValue { Array($0.listeners.values) }
        for l in listeners { l.yield(change) }
    }
}

/// One Bluetooth adapter as BlueZ shows it.
public struct BlueZAdapter: Sendable, Hashable {
    public let name: String
    public let path: String
    public let address: DeviceAddress
    public let powered: Bool

    static func all(in objects: BlueZObjects) -> [BlueZAdapter] {
        objects.objects(with: BlueZ.adapter).compactMap { path, props in
            guard let a = props["Address"]?.string.flatMap(DeviceAddress.init) else { return nil }
            return BlueZAdapter(name: String(path.split(separator: "/").last ?? ""), path: path, address: a,
                                powered: props["Powered"]?.bool ?? false)
        }.sorted { $0.name < $1.name }
    }

    /// Picks `wanted` ("hci1") or the first adapter, powering it on if it is off.
    static func choose(_ wanted: String?, in objects: BlueZObjects) async throws -> BlueZAdapter {
        let adapters = all(in: objects)
        if adapters.isEmpty, objects.objects(with: "org.bluez.AgentManager1").isEmpty {
            // The first read's error was let pass (a box waits for bluetoothd); say what it was.
            // A bluetoothd just restarted can take longer than one 5 s call to answer (seen in
            // the lab under load): a timed-out read is tried once more.
            do { try await objects.reload() } catch {
                guard case .timedOut = BlueZ.radioError(error), (try? await objects.reload()) != nil else {
                    throw RadioError.unavailable("cannot read bluetoothd's objects: \(BlueZ.radioError(error))")
                }
            }
            if all(in: objects).isEmpty, objects.objects(with: "org.bluez.AgentManager1").isEmpty {
                throw RadioError.unavailable("bluetoothd is not running (no org.bluez on the system bus)")
            }
            return try await choose(wanted, in: objects)
        }
        guard let adapter = wanted.map({ w in adapters.first { $0.name == w } }) ?? adapters.first else {
            let known = adapters.map(\.name).joined(separator: ", ")
            throw RadioError.unavailable(wanted.map { "no Bluetooth adapter \($0)" + (known.isEmpty ? "" : " (BlueZ has \(known))") }
                                         ?? "no Bluetooth adapter (BlueZ lists none)")
        }
        if !adapter.powered {
            do {
                _ = try await objects.bus.call(BlueZ.service, adapter.path, "org.freedesktop.DBus.Properties", "Set",
                                               [.string(BlueZ.adapter), .string("Powered"), .variant(.bool(true))], timeout: .seconds(5))
            } catch {
                throw RadioError.unavailable("adapter \(adapter.name) is off and could not be powered on: \(error) (is it blocked? try `rfkill list`)")
            }
        }
        return adapter
    }
}

/// Whether a BlueZ adapter is usable here, asked quickly: `auto` radio selection uses this.
public func blueZAdapterPresent(named wanted: String? = nil, bus: DBusConnection.Bus = .system) async -> Bool {
    guard let connection = try? DBusConnection(bus) else { return false }
    defer { connection.close() }
    // Asked of the bus first: a call to org.bluez with no owner would start bluetoothd.
    guard (try? await connection.nameHasOwner(BlueZ.service, timeout: .seconds(2))) == true else { return false }
    guard let reply = try? await connection.call(BlueZ.service, "/", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects", timeout: .seconds(2)) else {
        return false
    }
    for (path, interfaces) in reply.first?.entries ?? [] {
        guard let p = path.string, (interfaces.entries ?? []).contains(where: { $0.key.string == BlueZ.adapter }) else { continue }
        if wanted == nil || p.hasSuffix("/" + wanted!) { return true }
    }
    return false
}
