import BoxkeyCore
import CBoxkeySys
import BoxkeyRadio
import BoxkeySimRadio
import Foundation
import Logging
import ServiceLifecycle
import NIOConcurrencyHelpers

/// Assembles the daemon from its configuration: identity, phone registry, radio, logind, and
/// the services, and runs them until SIGTERM or SIGINT.
public enum Daemon {
    public struct StartError: Error, CustomStringConvertible {
        public let description: String
    }

    /// The simulated radio address of a box: stable per box ID, so phones find it again.
    public static func simulatedAddress(for id: BoxID) -> DeviceAddress {
        let d = id.description
        return DeviceAddress("00:B0:C5:00:\(d.prefix(2)):\(d.suffix(2))")!
    }

    public static func run(config: DaemonConfig, sessions: any SessionControl = LogindSessionControl(), logger: Logger) async throws {
        // Nothing of this process may end up in a core file: it holds keys and passwords.
        hardenProcess()
        let directory = config.simDirectory.isEmpty ? SocketAir.defaultDirectory : config.simDirectory
        let backend = try chooseRadio(config.radio, logger: logger)
        var simParameters = SimulationParameters()
        simParameters.seed = UInt64(getpid())
        let air = try SocketAir(directory: directory, parameters: simParameters)
        defer { air.shutdown() }

        // Avoid IDs heard nearby when making one up.
        var heard: Set<BoxID> = []
        if config.boxID == nil, !FileManager.default.fileExists(atPath: config.stateDirectory + "/identity") {
            heard = await nearbyBoxIDs(air: air, for: .seconds(2))
        }
        let identity: BoxIdentity
        let registry: PhoneRegistry
        do {
            identity = try BoxIdentity.loadOrCreate(directory: config.stateDirectory, configuredID: config.boxID, avoid: heard)
            registry = try PhoneRegistry.load(directory: config.stateDirectory)
        } catch {
            throw StartError(description: "\(error)")
        }
        let peripheral = try air.peripheral(simulatedAddress(for: identity.boxID), at: config.simPosition)
        let box = Box(config: config, identity: identity, registry: registry, sessions: sessions, clock: MonotonicClock(),
                      logger: logger, radioDescription: "\(backend) (\(directory), address \(peripheral.address))")
        let readiness = Readiness(parts: 2, logger: logger)
        let radio = RadioService(box: box, peripheral: peripheral, config: config, clock: MonotonicClock(), logger: logger, readiness: readiness)
        let bridge = PAMBridge(box: box, path: config.pamSocket, allowedUIDs: config.pamAllowedUIDs, logger: logger, readiness: readiness)
        let group = ServiceGroup(configuration: .init(
            services: [.init(service: radio), .init(service: bridge)],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        try await group.run()
        SystemdNotify.send("STOPPING=1")
        await box.shutdown()
    }

    static func chooseRadio(_ wanted: DaemonConfig.RadioBackend, logger: Logger) throws -> String {
        switch wanted {
        case .simulated:
            return "simulated radio"
        case .bluez:
            throw StartError(description: "the BlueZ transport is not in this build yet; use radio backend \"simulated\"")
        case .auto:
            let adapters = (try? FileManager.default.contentsOfDirectory(atPath: "/sys/class/bluetooth")) ?? []
            if !adapters.isEmpty {
                logger.warning("Bluetooth adapters found (\(adapters.joined(separator: ", "))) but this build has no BlueZ transport yet: using the simulated radio")
            }
            return "simulated radio"
        }
    }

    static func nearbyBoxIDs(air: SocketAir, for duration: Duration) async -> Set<BoxID> {
        let results = air.central(DeviceAddress("00:B0:C5:FF:FF:FE")!).scan(ScanFilter(serviceUUIDs: [BoxkeyProtocol.serviceUUID]))
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
        if done { SystemdNotify.send("READY=1\nSTATUS=advertising, PAM bridge listening") }
    }
}
