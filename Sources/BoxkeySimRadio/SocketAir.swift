import BoxkeyRadio
import FoundationEssentials
import NIOCore
import NIOPosix
import NIOConcurrencyHelpers

/// The simulated radio between processes on one machine: `boxkeyd` and `boxkey` run as
/// separate programs and find each other through a directory, with no broker.
///
/// - A peripheral publishes `<dir>/<address>.json` (its service, advertisement, position and
///   pid) and listens on `<dir>/<address>.sock`.
/// - A central reads the directory while it scans or connects, and connects to the socket.
///   The central's process owns the link's connection-event schedule (the central is the
///   link-layer master in BLE too); events for the peripheral cross the socket carrying the
///   CLOCK_MONOTONIC time at which they are due, so both processes share one time line.
/// - A process that dies without disconnecting is noticed by the other side after the
///   supervision timeout, as a phone whose battery died would be.
public enum SocketAirError: Error, CustomStringConvertible {
    case foreignDirectory(String)
    public var description: String {
        switch self { case .foreignDirectory(let why): "the simulated radio's folder is unsafe: \(why)" }
    }
}

public final class SocketAir: Sendable {
    public let air: SimulatedAir
    public let directory: String

    private struct State {
        var servers: [DeviceAddress: any Channel] = [:]
        var tasks: [UInt64: Task<Void, Never>] = [:]
        var nextTask: UInt64 = 0
        var lastRefresh: Duration = .zero
        var seenFiles: [String: Data] = [:]
        var remote: Set<DeviceAddress> = []
        var closed = false
    }
    private let state = NIOLockedValueBox(State())

    /// `$BOXKEY_SIM_DIR`, or /tmp/boxkey-sim.
    public static var defaultDirectory: String {
        ProcessInfo.processInfo.environment["BOXKEY_SIM_DIR"].flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp/boxkey-sim"
    }

    public init(directory: String = SocketAir.defaultDirectory, parameters: SimulationParameters = SimulationParameters()) throws {
        self.directory = directory
        // The air is shared like real air: anyone on the machine may listen and connect. Only
        // boxes (peripherals) write here; a root box's folder is root's alone to write.
        if !FileManager.default.fileExists(atPath: directory) {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            chmod(directory, geteuid() == 0 ? 0o755 : 0o1777)
        }
        // Root writes and chmods files here: never in a folder another user owns, where that
        // user could swap a name for a link to a file of root's.
        var st = stat()
        if geteuid() == 0, lstat(directory, &st) == 0, st.st_uid != 0 || (st.st_mode & S_IFMT) != S_IFDIR {
            throw SocketAirError.foreignDirectory("\(directory) belongs to uid \(st.st_uid) (or is not a folder); as root, use a folder of root's own, such as /run/boxkey-sim")
        }
        air = SimulatedAir(parameters: parameters, clock: MonotonicClock(), pacing: .realTime)
        air.state.withLockedValue { s in
            s.onPeripheralChange = { [weak self] address in self?.publishFile(of: address) }
            s.refresher = { [weak self] in self?.refresh() }
        }
    }

    /// A peripheral of this process, reachable from others.
    public func peripheral(_ address: DeviceAddress, at position: Double = 0) throws -> SimulatedPeripheral {
        let peripheral = air.peripheral(address, at: position)
        let path = socketPath(address)
        let server = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { [weak self] channel in
                guard let owner = self else { return channel.close() }
                return FrameConnection.configure(channel).map { connection in
                    owner.spawn { await owner.serveCentral(connection, peripheral: address) }
                }
            }
            .bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true)
            .wait()
        // Anyone may connect, as over real air; never through a link someone put at the name.
        fchmodat(AT_FDCWD, path, 0o666, AT_SYMLINK_NOFOLLOW)
        state.withLockedValue { $0.servers[address] = server }
        publishFile(of: address)
        return peripheral
    }

    public func central(_ address: DeviceAddress, at position: Double = 1) -> SimulatedCentral {
        air.central(address, at: position)
    }

    /// Stops listening and removes this process's files. Links end as if the process died.
    public func shutdown() {
        let (servers, tasks) = state.withLockedValue { s -> ([DeviceAddress: any Channel], [Task<Void, Never>]) in
            s.closed = true
            defer { s.servers = [:]; s.tasks = [:] }
            return (s.servers, Array(s.tasks.values))
        }
        for (address, server) in servers {
            server.close(promise: nil)
            unlink(filePath(address))
            unlink(socketPath(address))
        }
        for link in air.state.withLockedValue({ Array($0.links.values) }) { link.peripheralSink.linkEnded() }
        tasks.forEach { $0.cancel() }
    }

    deinit { shutdown() }

    // MARK: Files

    private func fileName(_ address: DeviceAddress) -> String { address.string.replacing(":", with: "-") }
    func filePath(_ address: DeviceAddress) -> String { "\(directory)/\(fileName(address)).json" }
    func socketPath(_ address: DeviceAddress) -> String { "\(directory)/\(fileName(address)).sock" }

    struct PeripheralFile: Codable {
        var address: String
        var pid: Int32
        var trajectory: Trajectory
        var service: GATTService?
        var advertising: AdvertisingData?
        var advertisingSince: Int64?
    }

    private func publishFile(of address: DeviceAddress) {
        guard state.withLockedValue({ $0.servers[address] != nil || !$0.closed }) else { return }
        let file = air.state.withLockedValue { s -> PeripheralFile? in
            guard let p = s.peripherals[address], p.mailbox != nil, let d = s.devices[address] else { return nil }
            return PeripheralFile(address: address.string, pid: getpid(), trajectory: d.trajectory, service: p.service,
                                  advertising: p.advertising?.data, advertisingSince: p.advertising?.since.nanoseconds)
        }
        guard let file, let data = try? JSONEncoder().encode(file) else { return }
        let path = filePath(address)
        // A new file of our own (O_EXCL, O_NOFOLLOW), its mode set on the descriptor, then
        // renamed into place: nothing here follows a name another user could have planted.
        let temporary = path + ".\(UInt64.random(in: 0...UInt64.max)).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return }
        fchmod(fd, 0o644)
        let written = data.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        if written == data.count, rename(temporary, path) == 0 { return }
        unlink(temporary)
    }

    /// Mirrors other processes' peripherals into this air. Called while scanning and before
    /// connecting; reads the directory at most every 50 ms.
    func refresh() {
        let now = air.clock.now
        let proceed = state.withLockedValue { s -> Bool in
            guard now - s.lastRefresh >= .milliseconds(50) else { return false }
            s.lastRefresh = now
            return true
        }
        guard proceed else { return }
        let local = Set(state.withLockedValue { Array($0.servers.keys) })
        var found: [String: Data] = [:]
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.hasSuffix(".json") {
            if let data = FileManager.default.contents(atPath: "\(directory)/\(name)") { found[name] = data }
        }
        let changed = state.withLockedValue { s -> Bool in
            defer { s.seenFiles = found }
            return s.seenFiles != found
        }
        guard changed else { return }
        var present: Set<DeviceAddress> = []
        for data in found.values {
            guard let file = try? JSONDecoder().decode(PeripheralFile.self, from: data),
                  let address = DeviceAddress(file.address), !local.contains(address), processAlive(file.pid) else { continue }
            present.insert(address)
            let path = socketPath(address)
            let connector: @Sendable (DeviceAddress, Trajectory) async throws -> any PeripheralSink = { central, trajectory in
                let connection = try await FrameConnection.connect(path: path)
                connection.send(.hello(central: central.string, trajectory: trajectory))
                return SocketPeripheralSink(connection: connection)
            }
            air.state.withLockedValue { s in
                var device = s.devices[address] ?? DeviceState(trajectory: file.trajectory)
                device.trajectory = file.trajectory
                s.devices[address] = device
                let advertising = file.advertising.map { ($0, Duration.nanoseconds(file.advertisingSince ?? 0)) }
                s.peripherals[address] = PeripheralState(mailbox: nil, connector: connector, service: file.service, advertising: advertising)
            }
        }
        let gone = state.withLockedValue { s -> Set<DeviceAddress> in
            defer { s.remote = present }
            return s.remote.subtracting(present)
        }
        air.state.withLockedValue { s in for a in gone { s.peripherals[a] = nil; s.devices[a] = nil } }
        air.signalChange()
    }

    private func processAlive(_ pid: Int32) -> Bool {
        kill(pid, 0) == 0 || errno == EPERM
    }

    // MARK: Tasks

    private func spawn(_ body: @escaping @Sendable () async -> Void) {
        let id = state.withLockedValue { s -> UInt64? in
            guard !s.closed else { return nil }
            s.nextTask += 1
            return s.nextTask
        }
        guard let id else { return }
        let task = Task { [weak self] in
            await body()
            _ = self?.state.withLockedValue { $0.tasks.removeValue(forKey: id) }
        }
        state.withLockedValue { $0.tasks[id] = task }
    }

    /// The peripheral side of one connection from another process.
    private func serveCentral(_ connection: FrameConnection, peripheral address: DeviceAddress) async {
        guard let mailbox = air.state.withLockedValue({ $0.peripherals[address]?.mailbox }) else { connection.close(); return }
        var remote: SocketRemoteCentral?
        for await frame in connection.frames {
            switch frame {
            case .hello(let central, let trajectory):
                guard remote == nil, let centralAddress = DeviceAddress(central) else { connection.close(); return }
                let id = CentralID(address: centralAddress, connection: air.nextConnectionID())
                let r = SocketRemoteCentral(id: id, peripheral: address, connection: connection, trajectory: trajectory, mailbox: mailbox, parameters: air.parameters)
                air.state.withLockedValue { $0.remoteCentrals[id.connection] = r }
                remote = r
            case .event(let wire, let time, let waits, let tag):
                guard let remote else { continue }
                let event = wire.event(for: remote.id)
                remote.observe(event)
                mailbox.push(event, at: .nanoseconds(time), waitsForClock: waits, tag: tag)
            case .cancel(let tag):
                mailbox.remove(tag: tag)
                remote?.lossCancelled()
            case .moved(let trajectory):
                remote?.moved(trajectory)
            case .notify, .disconnect:
                break
            }
        }
        if let remote {
            if remote.downReason == nil {
                remote.ended(.supervisionTimeout)
                mailbox.push(.disconnected(remote.id, reason: .supervisionTimeout), at: air.clock.now + air.parameters.supervisionTimeout, waitsForClock: true)
            }
            _ = air.state.withLockedValue { $0.remoteCentrals.removeValue(forKey: remote.id.connection) }
        }
    }
}

/// The central's process: events for a peripheral in another process go over the socket.
final class SocketPeripheralSink: PeripheralSink {
    let connection: FrameConnection
    private let reader = NIOLockedValueBox<Task<Void, Never>?>(nil)

    init(connection: FrameConnection) { self.connection = connection }

    func deliver(_ event: PeripheralEvent, at time: Duration, waitsForClock: Bool, tag: UInt64?) {
        connection.send(.event(WireEvent(event), time: time.nanoseconds, waitsForClock: waitsForClock, tag: tag))
    }

    func remove(tag: UInt64) { connection.send(.cancel(tag: tag)) }
    func take(after time: Duration) -> [(PeripheralEvent, Duration)] { [] }
    func centralMoved(_ trajectory: Trajectory) { connection.send(.moved(trajectory)) }

    func linkEnded() {
        connection.close()
        reader.withLockedValue { $0?.cancel() }
    }

    /// Starts reading what the peripheral sends on this link.
    func attach(_ link: SimLink, air: SimulatedAir) {
        let connection = connection
        let task = Task {
            for await frame in connection.frames {
                let now = air.clock.now
                switch frame {
                case .notify(let characteristic, let value, let time):
                    _ = link.sendToCentral(packets: air.parameters.packets(forValueLength: value.count), valueBytes: value.count,
                                           issuedAt: max(.nanoseconds(time), now), event: .notification(characteristic: characteristic, value: value), air: air)
                case .disconnect(let time):
                    link.close(by: .toCentral, at: max(.nanoseconds(time), now), air: air)
                default:
                    break
                }
            }
            // The peripheral's process went away without a word: contact is lost now.
            if link.downReason(at: air.clock.now) == nil { link.scheduleLoss(contactEnd: air.clock.now, air: air) }
        }
        reader.withLockedValue { $0 = task }
    }
}

/// The peripheral's process: a central in another process.
final class SocketRemoteCentral: RemoteCentral {
    let id: CentralID
    let peripheral: DeviceAddress
    let connection: FrameConnection
    let mailbox: TimedMailbox<PeripheralEvent>
    let pathLoss: PathLoss
    private struct State {
        var trajectory: Trajectory
        var subscriptions: Set<String> = []
        var mtu = 23
        var down: DisconnectReason?
        var rng: SeededGenerator
    }
    private let state: NIOLockedValueBox<State>

    init(id: CentralID, peripheral: DeviceAddress, connection: FrameConnection, trajectory: Trajectory, mailbox: TimedMailbox<PeripheralEvent>, parameters: SimulationParameters) {
        self.id = id
        self.peripheral = peripheral
        self.connection = connection
        self.mailbox = mailbox
        self.pathLoss = PathLoss(parameters)
        state = NIOLockedValueBox(State(trajectory: trajectory, rng: SeededGenerator(seed: parameters.seed ^ id.connection)))
    }

    var mtu: Int { state.withLockedValue { $0.mtu } }
    var downReason: DisconnectReason? { state.withLockedValue { $0.down } }

    func observe(_ event: PeripheralEvent) {
        state.withLockedValue { s in
            switch event {
            case .connected(_, let mtu): s.mtu = mtu
            case .subscribed(_, let c): s.subscriptions.insert(c)
            case .unsubscribed(_, let c): s.subscriptions.remove(c)
            case .wrote(_, _, _, let mtu): s.mtu = mtu
            case .disconnected(_, let reason): s.down = reason
            }
        }
    }

    func ended(_ reason: DisconnectReason) { state.withLockedValue { $0.down = $0.down ?? reason } }
    func lossCancelled() { state.withLockedValue { if $0.down == .supervisionTimeout { $0.down = nil } } }
    func moved(_ trajectory: Trajectory) { state.withLockedValue { $0.trajectory = trajectory } }
    func isSubscribed(_ characteristic: String) -> Bool { state.withLockedValue { $0.subscriptions.contains(characteristic) } }

    func notify(characteristic: String, value: [UInt8], issuedAt: Duration) {
        connection.send(.notify(characteristic: characteristic, value: value, time: issuedAt.nanoseconds))
    }

    func rssi(at t: Duration, peripheralPosition: Double, air: SimulatedAir) -> Int {
        state.withLockedValue { s in
            pathLoss.rssi(distance: abs(s.trajectory.position(at: t) - peripheralPosition), using: &s.rng)
        }
    }

    func disconnect(at t: Duration) {
        guard state.withLockedValue({ s -> Bool in defer { s.down = s.down ?? .localHost }; return s.down == nil }) else { return }
        connection.send(.disconnect(time: t.nanoseconds))
        mailbox.push(.disconnected(id, reason: .localHost), at: t)
    }
}
