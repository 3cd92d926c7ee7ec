import BoxkeyBlueZ
import BoxkeyCore
import BoxkeyHost
import BoxkeyPAMWire
import CBoxkeySys
import BoxkeyRadio
import BoxkeySimRadio
import FoundationEssentials
import Glibc
import Logging
import ServiceLifecycle
import UnixSignals
import NIOConcurrencyHelpers

/// Assembles the daemon from its configuration: identity, phone registry, radio, logind, and
/// the services, and runs them until SIGTERM or SIGINT.
public enum Daemon {
    public struct StartError: Error, CustomStringConvertible {
        public let description: String
        /// 78 (EX_CONFIG) when a file is to blame (its owner, mode or content), else 1.
        public var exitCode: Int32 = 1
    }

    /// The simulated radio address of a box: stable per box ID, so phones find it again.
    public static func simulatedAddress(for id: BoxID) -> DeviceAddress {
        let d = id.description
        return DeviceAddress("00:B0:C5:00:\(d.prefix(2)):\(d.suffix(2))")!
    }

    /// `reload` re-reads the configuration file on SIGHUP (nil: SIGHUP is ignored).
    public static func run(config: DaemonConfig, sessions: any SessionControl = LogindSessionControl(), logger: Logger,
                           reload: (@Sendable () throws -> DaemonConfig)? = nil) async throws {
        // Nothing of this process may end up in a core file: it holds keys and passwords.
        hardenProcess()
        // Until the reload service listens, a SIGHUP (a `systemctl reload` while it waits for
        // the adapter) must not end the daemon: its default action would.
        signal(SIGHUP, SIG_IGN)
        // The box's own files first, before waiting for any radio: a state folder or file that
        // another account could have written stops the daemon at once (exit 78), saying which
        // and what to run; it is never believed, and never silently made private.
        let stored: BoxIdentity?
        let registry: PhoneRegistry
        let escrow: EscrowStore
        do {
            try PrivateFiles.ensureOwnDirectory(config.stateDirectory)
            stored = try BoxIdentity.loadIfPresent(path: config.stateDirectory + "/identity")
            registry = try PhoneRegistry.load(directory: config.stateDirectory)
            escrow = try EscrowStore.load(directory: config.stateDirectory)
        } catch {
            throw StartError(description: "\(error)", exitCode: 78)
        }
        // A box ID made up here avoids the IDs heard nearby; with no radio yet there is nothing to
        // hear, and the box (its sockets, its admin) must not wait for one.
        var heard: Set<BoxID> = []
        var early: BoxRadio?
        if config.boxID == nil, stored == nil, let radio = try await openRadioIfThere(config, logger: logger) {
            heard = await nearbyBoxIDs(radio.scanner, for: .seconds(2))
            early = radio
        }
        let identity: BoxIdentity
        do {
            identity = try BoxIdentity.loadOrCreate(directory: config.stateDirectory, configuredID: config.boxID, avoid: heard)
        } catch {
            throw StartError(description: "\(error)", exitCode: 78)
        }
        // The box, its PAM and admin socket and its reloads run from here on, radio or not;
        // the radio's services join when it is there (RadioSupervisor).
        let box = Box(config: config, identity: identity, registry: registry, escrow: escrow, sessions: sessions, clock: MonotonicClock(),
                      logger: logger, radioDescription: "waiting for the radio", radioAttached: false)
        let readiness = Readiness(parts: 2, logger: logger)
        let reloader = ReloadService(box: box, load: reload ?? { config }, logger: logger)
        let bridge = PAMBridge(box: box, path: config.pamSocket, allowedUIDs: config.pamAllowedUIDs, logger: logger, readiness: readiness)
        let reloadNow: (@Sendable () async -> PAMReply)? = reload == nil ? nil : { @Sendable in await reloader.reloadNow() }
        // Root only, whatever [pam] allowed_uids lets onto the PAM socket.
        let admin = PAMBridge(box: box, role: .admin, path: config.adminSocket, allowedUIDs: [], logger: logger,
                              readiness: readiness, reload: reloadNow)
        let radio = RadioSupervisor(box: box, config: config, logger: logger, readiness: readiness, early: early)
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [.init(service: bridge), .init(service: admin), .init(service: reloader), .init(service: radio)]
        if let fleet = config.fleet {
            services.append(.init(service: FleetService(box: box, settings: fleet, stateDirectory: config.stateDirectory, logger: logger)))
        }
        let group = ServiceGroup(configuration: .init(
            services: services,
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        try await group.run()
        SystemdNotify.send("STOPPING=1")
        await box.shutdown()
    }

    /// The box's radio: BlueZ on a real adapter, or the simulated air shared with phones on
    /// this machine.
    final class BoxRadio: @unchecked Sendable {
        let description: String
        /// A central on the same radio, to hear which box IDs are taken nearby.
        let scanner: any CentralRadio
        private let simulated: (air: SocketAir, position: Double)?
        private let bluez: BlueZPeripheral?
        private let bluezScanner: BlueZCentral?

        init(air: SocketAir, position: Double) {
            simulated = (air, position)
            bluez = nil
            bluezScanner = nil
            scanner = air.central(DeviceAddress("00:B0:C5:FF:FF:FE")!)
            description = "simulated radio (\(air.directory))"
        }

        init(peripheral: BlueZPeripheral, scanner: BlueZCentral) {
            simulated = nil
            bluez = peripheral
            bluezScanner = scanner
            self.scanner = scanner
            description = "BlueZ adapter \(peripheral.adapter.name)"
        }

        func peripheral(_ id: BoxID) async throws -> any PeripheralRadio {
            if let bluez {
                bluezScanner?.close()
                return bluez
            }
            return try simulated!.air.peripheral(Daemon.simulatedAddress(for: id), at: simulated!.position)
        }

        func shutdown() {
            simulated?.air.shutdown()
            if let bluez {
                let done = NIOLockedValueBox(false)
                Task { await bluez.close(); done.withLockedValue { $0 = true } }
                // Unregistering takes a few bus round trips; do not hold shutdown for long.
                for _ in 0..<40 where !done.withLockedValue({ $0 }) { usleep(25_000) }
            }
        }
    }

    static func openRadio(_ config: DaemonConfig, logger: Logger, box: Box?) async throws -> BoxRadio {
        let choice: RadioChoice
        do { choice = try await RadioChoice.resolve(config.radio, adapter: config.adapter, simDirectory: config.simDirectory) } catch {
            throw StartError(description: "\(error); set [radio] backend = \"bluez\" to wait for it")
        }
        switch choice {
        case .simulated(let directory):
            if config.radio == .auto {
                logger.notice("no Bluetooth adapter: [radio] backend = \"auto\" uses the simulated radio, which no phone on real Bluetooth hears")
            }
            var parameters = SimulationParameters()
            parameters.seed = UInt64(getpid())
            do { return BoxRadio(air: try RadioChoice.openSimulatedAir(directory, parameters: parameters), position: config.simPosition) } catch {
                throw StartError(description: "\(error)")
            }
        case .bluez(let adapter):
            return try await blueZRadio(adapter, logger: logger, box: box)
        }
    }

    /// The radio if it can be had at once (to hear nearby box IDs before making one up), else nil.
    static func openRadioIfThere(_ config: DaemonConfig, logger: Logger) async throws -> BoxRadio? {
        if case .bluez(let adapter)? = try? await RadioChoice.resolve(config.radio, adapter: config.adapter, simDirectory: config.simDirectory) {
            guard await blueZAdapterPresent(named: adapter) else {
                logger.notice("no Bluetooth adapter yet: choosing a box ID without hearing which are taken nearby (set [box] id to choose one)")
                return nil
            }
            // An adapter that is there but cannot be opened (blocked by rfkill, which the seat's
            // user may do) must not keep the sockets away: a few seconds, then no radio yet.
            let opened = await withTaskGroup(of: BoxRadio?.self) { group in
                group.addTask { try? await openRadio(config, logger: logger, box: nil) }
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
        return try await openRadio(config, logger: logger, box: nil)
    }

    /// BlueZ, waiting for bluetoothd and the adapter when they are not there yet (a box that
    /// boots before its Bluetooth dongle is plugged in still comes up), without starting
    /// bluetoothd: `BlueZWatch` looks when the bus says something changed.
    static func blueZRadio(_ adapter: String?, logger: Logger, box: Box?) async throws -> BoxRadio {
        let said = NIOLockedValueBox<String?>(nil)
        return try await BlueZWatch.waitForAdapter(waiting: { why in
            let first = said.withLockedValue { s -> Bool in defer { s = why }; return s != why }
            guard first else { return }
            logger.warning("waiting for Bluetooth: \(why)")
            SystemdNotify.send("STATUS=PAM and admin socket listening; waiting for Bluetooth: \(why)")
            if let box { Task { await box.radioChanged("waiting for Bluetooth: \(why)", attached: false) } }
        }) {
            let peripheral = try await BlueZPeripheral(adapter: adapter)
            let scanner = try await BlueZCentral(adapter: peripheral.adapter.name)
            if said.withLockedValue({ $0 }) != nil { logger.info("Bluetooth adapter \(peripheral.adapter.name) is here") }
            return BoxRadio(peripheral: peripheral, scanner: scanner)
        }
    }

    static func nearbyBoxIDs(_ scanner: any CentralRadio, for duration: Duration) async -> Set<BoxID> {
        let results = scanner.scan(ScanFilter(serviceUUIDs: [BoxkeyProtocol.serviceUUID]))
        let clock = MonotonicClock()
        return await withTaskGroup(of: Set<BoxID>?.self) { group in
            group.addTask { try? await clock.sleep(for: duration); return nil }
            group.addTask {
                var heard: Set<BoxID> = []
                do {
                    for try await r in results {
                        if let payload = r.advertisement.manufacturerData[BoxkeyProtocol.companyID],
                           let advert = try? Advertisement.decode(payload) { heard.insert(advert.boxID) }
                    }
                } catch {}
                return heard
            }
            _ = await group.next()
            group.cancelAll()
            var all: Set<BoxID> = []
            for await ids in group { if let ids { all.formUnion(ids) } }
            return all
        }
    }

    static func hardenProcess() {
        _ = boxkey_disable_core_dumps()
        umask(0o077)
    }
}

/// The radio, whenever it can be had: waits for it (bluetoothd and the adapter, or the
/// simulated air), tells the box, then runs the radio's services (advertising, links,
/// presence). The box and its sockets run meanwhile; prompts take no pushes until then.
struct RadioSupervisor: Service {
    let box: Box
    let config: DaemonConfig
    let logger: Logger
    let readiness: Readiness
    /// The radio already opened to hear nearby box IDs, if it was.
    let early: Daemon.BoxRadio?

    func run() async throws {
        let boxRadio: Daemon.BoxRadio
        do {
            if let early { boxRadio = early } else {
                boxRadio = try await cancelWhenGracefulShutdown { try await Daemon.openRadio(config, logger: logger, box: box) }
            }
        } catch is CancellationError { return }
        defer { boxRadio.shutdown() }
        let peripheral = try await boxRadio.peripheral(box.identity.boxID)
        await box.radioChanged("\(boxRadio.description), address \(peripheral.address)", attached: true)
        let radio = RadioService(box: box, peripheral: peripheral, config: config, clock: MonotonicClock(), logger: logger, readiness: readiness)
        let presence = PresenceService(box: box, peripheral: peripheral, clock: MonotonicClock())
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await radio.run() }
            group.addTask { try await presence.run() }
        }
    }
}

/// SIGHUP (`systemctl reload boxkeyd`): re-reads the configuration file and applies what can
/// change while running. A file that no longer parses changes nothing.
struct ReloadService: Service {
    let box: Box
    let load: @Sendable () throws -> DaemonConfig
    let logger: Logger

    func run() async throws {
        // A SIGHUP while the daemon waited for Bluetooth was ignored: read the file once now,
        // and say so only if that changed something.
        if let reloaded = try? load() {
            let before = await box.config
            logger.debug("start-up re-read: running \(before.phoneLoginServices.sorted()) file \(reloaded.phoneLoginServices.sorted())")
            let (changed, _) = await box.reload(reloaded)
            if !changed.isEmpty { logger.notice("reloaded the configuration: it changed while the daemon started: \(changed.joined(separator: ", "))") }
        }
        for await _ in await UnixSignalsSequence(trapping: .sighup).cancelOnGracefulShutdown() {
            _ = await reloadNow()
        }
    }

    /// Re-reads the file and applies it; the outcome is logged, kept for `boxkeyd status`, and
    /// answered (`boxkeyd reload`, systemd's ExecReload, waits for it and fails when it failed).
    func reloadNow() async -> PAMReply {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        SystemdNotify.send("RELOADING=1\nMONOTONIC_USEC=\(Int(now.tv_sec) * 1_000_000 + now.tv_nsec / 1000)")
        defer { SystemdNotify.send("READY=1") }
        do {
            let (changed, needRestart) = await box.reload(try load())
            var text = "reloaded the configuration: \(changed.isEmpty ? "nothing to change" : "changed " + changed.joined(separator: ", "))"
            logger.notice("\(text)")
            if !needRestart.isEmpty {
                logger.warning("not applied until boxkeyd restarts: \(needRestart.joined(separator: ", "))")
                text += "; not applied until boxkeyd restarts: \(needRestart.joined(separator: ", "))"
            }
            await box.reloaded(text)
            return .text(text)
        } catch {
            logger.error("reload failed, the running settings stay: \(error)")
            await box.reloaded("failed: \(error); the running settings stay")
            return .error("reload failed, the running settings stay: \(error)")
        }
    }
}

/// Tells systemd the daemon is ready (Type=notify) once every part has said so.
public final class Readiness: Sendable {
    private let remaining: NIOLockedValueBox<Int>
    private let logger: Logger

    init(parts: Int, logger: Logger) {
        remaining = NIOLockedValueBox(parts)
        self.logger = logger
    }

    func ready(_ part: String) {
        let done = remaining.withLockedValue { n -> Bool in n -= 1; return n == 0 }
        logger.debug("\(part) ready")
        if done { SystemdNotify.send("READY=1\nSTATUS=PAM and admin socket listening") }
    }

    /// systemctl status's line: what the daemon does or waits for.
    func status(_ text: String) { SystemdNotify.send("STATUS=\(text)") }
}
