import BoxkeyBlueZ
import BoxkeyCore
import BoxkeyDaemon
import BoxkeyRadio
import BoxkeySimRadio
import Glibc
import Logging
import NIOConcurrencyHelpers

/// Opens the box's radio as `[radio]` says: BlueZ on a real adapter (waiting for bluetoothd and
/// the adapter when they are not there yet), or the simulated air shared with phones here.
public struct BoxRadios: BoxRadioSource {
    public init() {}

    /// The simulated radio address of a box: stable per box ID, so phones find it again.
    public static func simulatedAddress(for id: BoxID) -> DeviceAddress {
        let d = id.description
        return DeviceAddress("00:B0:C5:00:\(d.prefix(2)):\(d.suffix(2))")!
    }

    public func open(_ config: DaemonConfig, logger: Logger, waiting: @escaping @Sendable (String) -> Void) async throws -> any BoxRadio {
        let choice: RadioChoice
        do { choice = try await RadioChoice.resolve(config.radio, adapter: config.adapter, simDirectory: config.simDirectory) } catch {
            throw Daemon.StartError(description: "\(error); set [radio] backend = \"bluez\" to wait for it")
        }
        switch choice {
        case .simulated(let directory):
            if config.radio == .auto {
                logger.notice("no Bluetooth adapter: [radio] backend = \"auto\" uses the simulated radio, which no phone on real Bluetooth hears")
            }
            var parameters = SimulationParameters()
            parameters.seed = UInt64(getpid())
            do { return SimulatedBoxRadio(air: try RadioChoice.openSimulatedAir(directory, parameters: parameters), position: config.simPosition) } catch {
                throw Daemon.StartError(description: "\(error)")
            }
        case .bluez(let adapter):
            return try await blueZRadio(adapter, logger: logger, waiting: waiting)
        }
    }

    public func openIfThere(_ config: DaemonConfig, logger: Logger) async throws -> (any BoxRadio)? {
        let waiting: @Sendable (String) -> Void = { why in logger.warning("waiting for Bluetooth: \(why)") }
        if case .bluez(let adapter)? = try? await RadioChoice.resolve(config.radio, adapter: config.adapter, simDirectory: config.simDirectory) {
            guard await blueZAdapterPresent(named: adapter) else {
                logger.notice("no Bluetooth adapter yet: choosing a box ID without hearing which are taken nearby (set [box] id to choose one)")
                return nil
            }
            // An adapter that is there but cannot be opened (blocked by rfkill, which the seat's
            // user may do) must not keep the sockets away: a few seconds, then no radio yet.
            let opened = await withTaskGroup(of: (any BoxRadio)?.self) { group in
                group.addTask { try? await open(config, logger: logger, waiting: waiting) }
                group.addTask { try? await Task.sleep(for: .seconds(5)); return nil }
                let first = await group.next() ?? nil
                group.cancelAll()
                for await late in group { late?.shutdown() }  // opened just as the time ran out
                return first
            }
            if opened == nil {
                logger.notice("the Bluetooth adapter did not open within 5 s: choosing a box ID without hearing which are taken nearby (set [box] id to choose one)")
            }
            return opened
        }
        return try await open(config, logger: logger, waiting: waiting)
    }

    /// A central only, to hear what boxes advertise nearby (`boxkeyd doctor`) beside a running
    /// daemon: nothing is registered or advertised. Nil when there is no radio to listen on.
    public func listener(_ config: DaemonConfig) async -> (any CentralRadio)? {
        switch try? await RadioChoice.resolve(config.radio, adapter: config.adapter, simDirectory: config.simDirectory) {
        case .simulated(let directory)?:
            guard let air = try? RadioChoice.openSimulatedAir(directory, parameters: SimulationParameters()) else { return nil }
            return SimulatedListener(air: air, central: air.central(DeviceAddress("00:B0:C5:FF:FF:FD")!))
        case .bluez(let adapter)?:
            guard await blueZAdapterPresent(named: adapter) else { return nil }
            return try? await BlueZCentral(adapter: adapter)
        case nil:
            return nil
        }
    }

    /// BlueZ, waiting for bluetoothd and the adapter when they are not there yet, without
    /// starting bluetoothd: `BlueZWatch` looks when the bus says something changed.
    private func blueZRadio(_ adapter: String?, logger: Logger, waiting: @escaping @Sendable (String) -> Void) async throws -> any BoxRadio {
        let said = NIOLockedValueBox<String?>(nil)
        return try await BlueZWatch.waitForAdapter(waiting: { why in
            let first = said.withLockedValue { s -> Bool in defer { s = why }; return s != why }
            if first { waiting(why) }
        }) {
            let peripheral = try await BlueZPeripheral(adapter: adapter)
            let scanner = try await BlueZCentral(adapter: peripheral.adapter.name)
            if said.withLockedValue({ $0 }) != nil { logger.info("Bluetooth adapter \(peripheral.adapter.name) is here") }
            return BlueZBoxRadio(peripheral: peripheral, scanner: scanner)
        }
    }
}

/// A central on the simulated air that keeps the air open (it reads the other processes'
/// boxes) for as long as it is used.
private struct SimulatedListener: CentralRadio {
    let air: SocketAir
    let central: any CentralRadio
    var address: DeviceAddress { central.address }
    func scan(_ filter: ScanFilter) -> AsyncThrowingStream<ScanResult, any Error> { central.scan(filter) }
    func connect(to address: DeviceAddress, timeout: Duration) async throws -> any CentralLink {
        try await central.connect(to: address, timeout: timeout)
    }
}

/// The box on the simulated air, at `position` metres from the origin.
final class SimulatedBoxRadio: BoxRadio {
    let air: SocketAir
    let position: Double
    let scanner: any CentralRadio
    var description: String { "simulated radio (\(air.directory))" }

    init(air: SocketAir, position: Double) {
        self.air = air
        self.position = position
        scanner = air.central(DeviceAddress("00:B0:C5:FF:FF:FE")!)
    }

    func peripheral(_ id: BoxID) async throws -> any PeripheralRadio {
        try air.peripheral(BoxRadios.simulatedAddress(for: id), at: position)
    }

    func shutdown() { air.shutdown() }
}

/// The box on a BlueZ adapter: its GATT server and advertisement, and a central used only
/// before advertising, to hear which box IDs are taken.
final class BlueZBoxRadio: BoxRadio {
    let bluez: BlueZPeripheral
    let bluezScanner: BlueZCentral
    var scanner: any CentralRadio { bluezScanner }
    var description: String { "BlueZ adapter \(bluez.adapter.name)" }

    init(peripheral: BlueZPeripheral, scanner: BlueZCentral) {
        bluez = peripheral
        bluezScanner = scanner
    }

    func peripheral(_ id: BoxID) async throws -> any PeripheralRadio {
        bluezScanner.close()
        return bluez
    }

    func shutdown() {
        let done = NIOLockedValueBox(false)
        let bluez = bluez
        Task { await bluez.close(); done.withLockedValue { $0 = true } }
        // Unregistering takes a few bus round trips; do not hold shutdown for long.
        for _ in 0..<40 where !done.withLockedValue({ $0 }) { usleep(25_000) }
    }
}
