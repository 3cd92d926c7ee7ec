import BoxkeyCore
import BoxkeyHost
import BoxkeyPAMWire
import CBoxkeySys
import BoxkeyRadio
import FoundationEssentials
import Glibc
import Logging
import ServiceLifecycle
import NIOConcurrencyHelpers

/// Assembles the daemon from its configuration: identity, phone registry, radio, logind, and
/// the services, and runs them until SIGTERM or SIGINT.
public enum Daemon {
    public struct StartError: Error, CustomStringConvertible {
        public let description: String
        /// 78 (EX_CONFIG) when a file is to blame (its owner, mode or content), else 1.
        public var exitCode: Int32 = 1

        public init(description: String, exitCode: Int32 = 1) {
            self.description = description
            self.exitCode = exitCode
        }
    }

    /// `radios` opens the radio the configuration names (BoxkeyTransports' `BoxRadios`): this
    /// library never names a transport. `reload` re-reads the configuration file on SIGHUP
    /// (nil: SIGHUP is ignored).
    public static func run(config: DaemonConfig, radios: any BoxRadioSource, sessions: any SessionControl = LogindSessionControl(), logger: Logger,
                           reload: (@Sendable () throws -> DaemonConfig)? = nil) async throws {
        // Nothing of this process may end up in a core file: it holds keys and passwords.
        hardenProcess()
        // From here a SIGHUP waits in a pipe until the signal service reads it: a `systemctl
        // reload` while the daemon starts must not end it (SIGHUP's default action would).
        let signals: AsyncStream<SignalPipe.Caught>
        do {
            signals = try SignalPipe.open()
            try SignalPipe.catchSignals([SIGHUP])
        } catch {
            throw StartError(description: "\(error)")
        }
        // The box's own files first, before waiting for any radio: a state folder or file that
        // another account could have written stops the daemon at once (exit 78), saying which
        // and what to run; it is never believed, and never silently made private.
        let stored: BoxIdentity?
        let registry: PhoneRegistry
        let escrow: EscrowStore
        do {
            try PrivateFiles.ensureOwnDirectory(config.stateDirectory)
            // A box cloned from an image gets an identity of its own (MachineBinding).
            if let cloned = try MachineBinding.check(stateDirectory: config.stateDirectory) { logger.notice("\(cloned)") }
            stored = try BoxIdentity.loadIfPresent(path: config.stateDirectory + "/identity")
            registry = try PhoneRegistry.load(directory: config.stateDirectory)
            escrow = try EscrowStore.load(directory: config.stateDirectory)
        } catch {
            throw StartError(description: "\(error)", exitCode: 78)
        }
        // A box ID made up here avoids the IDs heard nearby; with no radio yet there is nothing to
        // hear, and the box (its sockets, its admin) must not wait for one.
        var heard: Set<BoxID> = []
        var early: (any BoxRadio)?
        if config.boxID == nil, stored == nil, let radio = try await radios.openIfThere(config, logger: logger) {
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
        // What the daemon before this one guarded (a restart, an upgrade, a crash), before any
        // prompt or phone is served.
        await box.resume(from: config.guardFile)
        let readiness = Readiness(parts: 2, logger: logger)
        let reloader = SignalService(box: box, signals: signals, load: reload ?? { config }, logger: logger, readiness: readiness)
        let bridge = PAMBridge(box: box, path: config.pamSocket, allowedUIDs: config.pamAllowedUIDs, logger: logger, readiness: readiness)
        let reloadNow: (@Sendable () async -> AdminReply)? = reload == nil ? nil : { @Sendable in await reloader.reloadNow() }
        // Root only, whatever [pam] allowed_uids lets onto the PAM socket.
        let admin = AdminSocket(box: box, path: config.adminSocket, logger: logger, readiness: readiness, reload: reloadNow)
        let radio = RadioSupervisor(box: box, config: config, radios: radios, logger: logger, readiness: readiness, early: early)
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [.init(service: bridge), .init(service: admin), .init(service: reloader, successTerminationBehavior: .gracefullyShutdownGroup), .init(service: radio),
                                                                          .init(service: WatchdogService(adminSocket: config.adminSocket, logger: logger))]
        if let fleet = config.fleet {
            services.append(.init(service: FleetService(box: box, settings: fleet, stateDirectory: config.stateDirectory, logger: logger)))
        }
        let group = ServiceGroup(configuration: .init(
            services: services,
            logger: logger))
        // SIGTERM and SIGINT stop the service group gracefully from here; before, they end
        // the daemon at once, as they did when the service group caught them itself.
        do { try SignalPipe.catchSignals([SIGTERM, SIGINT]) } catch { throw StartError(description: "\(error)") }
        try await group.run()
        SystemdNotify.send("STOPPING=1")
        await box.shutdown()
    }

    static func nearbyBoxIDs(_ scanner: any CentralRadio, for duration: Duration) async -> Set<BoxID> {
        Set(await nearbyAdvertisements(scanner, for: duration).map(\.boxID))
    }

    /// The Boxkey advertisements heard within `duration` (each box's first).
    public static func nearbyAdvertisements(_ scanner: any CentralRadio, for duration: Duration) async -> [Advertisement] {
        let results = scanner.scan(ScanFilter(serviceUUIDs: [BoxkeyProtocol.serviceUUID]))
        let clock = MonotonicClock()
        return await withTaskGroup(of: [Advertisement]?.self) { group in
            group.addTask { try? await clock.sleep(for: duration); return nil }
            group.addTask {
                var heard: [Advertisement] = []
                do {
                    for try await r in results {
                        if let payload = r.advertisement.manufacturerData[BoxkeyProtocol.companyID],
                           let advert = try? Advertisement.decode(payload),
                           !heard.contains(where: { $0.boxID == advert.boxID && $0.keyHint == advert.keyHint }) { heard.append(advert) }
                    }
                } catch {}
                return heard
            }
            _ = await group.next()
            group.cancelAll()
            var all: [Advertisement] = []
            for await found in group { if let found { all += found } }
            return all
        }
    }

    static func hardenProcess() {
        _ = boxkey_disable_core_dumps()
        umask(0o077)
    }
}

/// The box's radio, as the daemon needs it. BoxkeyTransports has the two there are (BlueZ on a
/// real adapter, the simulated air shared with phones on this machine).
public protocol BoxRadio: AnyObject, Sendable {
    /// What it is, for `boxkeyd status` ("BlueZ adapter hci0").
    var description: String { get }
    /// A central on the same radio, to hear which box IDs are taken nearby.
    var scanner: any CentralRadio { get }
    /// The peripheral the box advertises and takes links on (once: it closes the scanner).
    func peripheral(_ id: BoxID) async throws -> any PeripheralRadio
    func shutdown()
}

/// Opens the box's radio as `[radio]` says.
public protocol BoxRadioSource: Sendable {
    /// The radio if it can be had at once (to hear nearby box IDs before making one up), else nil.
    func openIfThere(_ config: DaemonConfig, logger: Logger) async throws -> (any BoxRadio)?
    /// The radio, waiting for it as long as it takes (a box that boots before its Bluetooth
    /// dongle is plugged in still comes up); `waiting` hears why, once per change.
    func open(_ config: DaemonConfig, logger: Logger, waiting: @escaping @Sendable (String) -> Void) async throws -> any BoxRadio
}

/// The radio, whenever it can be had: waits for it (bluetoothd and the adapter, or the
/// simulated air), tells the box, then runs the radio's services (advertising, links,
/// presence). The box and its sockets run meanwhile; prompts take no pushes until then.
struct RadioSupervisor: Service {
    let box: Box
    let config: DaemonConfig
    let radios: any BoxRadioSource
    let logger: Logger
    let readiness: Readiness
    /// The radio already opened to hear nearby box IDs, if it was.
    let early: (any BoxRadio)?

    func run() async throws {
        let boxRadio: any BoxRadio
        do {
            if let early { boxRadio = early } else { boxRadio = try await openWaiting() }
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

    /// Opens the radio, telling the box (for `boxkeyd status`) what it waits for meanwhile.
    /// The reasons reach the box in order and all before the radio is attached: a late
    /// "waiting" must not mark an attached radio as missing (prompts would stop offering).
    private func openWaiting() async throws -> any BoxRadio {
        let (reasons, said) = AsyncStream.makeStream(of: String.self)
        let logger = logger
        return try await withThrowingTaskGroup(of: (any BoxRadio)?.self) { group in
            group.addTask {
                for await why in reasons { await box.radioChanged("waiting for Bluetooth: \(why)", attached: false) }
                return nil
            }
            group.addTask {
                defer { said.finish() }
                return try await cancelWhenGracefulShutdown {
                    try await radios.open(config, logger: logger, waiting: { why in
                        logger.warning("waiting for Bluetooth: \(why)")
                        readiness.status("PAM and admin socket listening; waiting for Bluetooth: \(why)")
                        said.yield(why)
                    })
                }
            }
            var opened: (any BoxRadio)?
            for try await result in group { if let result { opened = result } }
            guard let opened else { throw CancellationError() }
            return opened
        }
    }
}

/// The daemon's signals. SIGHUP (`systemctl reload boxkeyd`) re-reads the configuration file and
/// applies what can change while running; a file that no longer parses changes nothing. SIGTERM
/// and SIGINT end this service, and so the daemon, gracefully.
struct SignalService: Service {
    let box: Box
    let signals: AsyncStream<SignalPipe.Caught>
    let load: @Sendable () throws -> DaemonConfig
    let logger: Logger
    /// Tells systemd about reloads once the daemon said it is ready (a reload's READY=1 before
    /// that would tell it the start-up is done).
    let readiness: Readiness?

    func run() async throws {
        // A SIGHUP while the daemon started (it may have waited for Bluetooth) is answered by
        // reading the file once now, said only if that changed something; the SIGHUPs that
        // came before this read are not read again.
        let readAt = SignalPipe.now()
        if let reloaded = try? load() {
            let before = await box.config
            logger.debug("start-up re-read: running \(before.phoneLoginServices.sorted()) file \(reloaded.phoneLoginServices.sorted())")
            let (changed, _) = await box.reload(reloaded)
            if !changed.isEmpty { logger.notice("reloaded the configuration: it changed while the daemon started: \(changed.joined(separator: ", "))") }
        }
        for await signal in signals.cancelOnGracefulShutdown() {
            guard signal.number == SIGHUP else {
                logger.info("\(signal.number == SIGTERM ? "SIGTERM" : "SIGINT"): stopping")
                return
            }
            if signal.at > readAt { _ = await reloadNow() }
        }
    }

    /// Re-reads the file and applies it; the outcome is logged, kept for `boxkeyd status`, and
    /// answered (`boxkeyd reload`, systemd's ExecReload, waits for it and fails when it failed).
    func reloadNow() async -> AdminReply {
        let tellSystemd = readiness?.isReady ?? true
        if tellSystemd {
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            SystemdNotify.send("RELOADING=1\nMONOTONIC_USEC=\(Int(now.tv_sec) * 1_000_000 + now.tv_nsec / 1000)")
        }
        defer { if tellSystemd { SystemdNotify.send("READY=1") } }
        do {
            let loaded = try load()
            for warning in loaded.warnings { logger.warning("\(warning)") }
            let (changed, needRestart) = await box.reload(loaded)
            var text = "reloaded the configuration: \(changed.isEmpty ? "nothing to change" : "changed " + changed.joined(separator: ", "))"
            if !loaded.warnings.isEmpty { text += "; warnings: " + loaded.warnings.joined(separator: "; ") }
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

/// Tells systemd the daemon is ready (Type=notify) once every part has said so, and keeps
/// systemctl status's line: the last thing said, whichever part said it first.
public final class Readiness: Sendable {
    private struct Told {
        var remaining: Int
        var status = "PAM and admin socket listening"
    }
    private let told: NIOLockedValueBox<Told>
    private let logger: Logger

    init(parts: Int, logger: Logger) {
        told = NIOLockedValueBox(Told(remaining: parts))
        self.logger = logger
    }

    /// Whether every part said it is ready (READY=1 went to systemd).
    var isReady: Bool { told.withLockedValue { $0.remaining <= 0 } }

    func ready(_ part: String) {
        logger.debug("\(part) ready")
        // READY=1 carries the newest status: the radio may have said "waiting for Bluetooth"
        // before the last socket listened, and that must stay the line systemctl shows.
        let done = told.withLockedValue { t -> Bool in
            t.remaining -= 1
            guard t.remaining == 0 else { return false }
            SystemdNotify.send("READY=1\nSTATUS=\(t.status)")
            return true
        }
        if done { settled() }
    }

    /// Start-up is over (the sockets listen, or the radio advertises): the program's pages that
    /// only start-up used go back (`boxkey_release_program_pages`); the RSS of an idle daemon is
    /// then what it uses, not what the Swift runtime read once.
    func settled() {
        let released = boxkey_release_program_pages()
        logger.debug("start-up over: handed back \(released / 1024) KiB of program mappings")
    }

    /// systemctl status's line: what the daemon does or waits for. Sent under the lock, so two
    /// parts saying something at once leave systemd the one kept here.
    func status(_ text: String) {
        told.withLockedValue { t in
            t.status = text
            SystemdNotify.send("STATUS=\(text)")
        }
    }
}
