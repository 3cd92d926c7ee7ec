import BoxkeyCore
import FoundationEssentials
import Glibc
import Logging
import NIOPosix
import ServiceLifecycle

/// Reads the fleet directory every `[fleet] refresh_s` and hands the roster to the box; keeps
/// the last read in `<state>/fleet-roster.json` (sealed under the box's key) for a restart while
/// the directory is away; and
/// publishes phones enrolled here when `[fleet] publish` is on. Directory calls block, so they
/// run on NIO's thread pool, never on the box's actor.
struct FleetService: Service {
    let box: Box
    let directory: FleetDirectory
    let cachePath: String
    let logger: Logger

    let certificatePath: String

    init(box: Box, settings: DaemonConfig.Fleet, stateDirectory: String, logger: Logger) {
        self.box = box
        directory = FleetDirectory(settings: settings)
        cachePath = stateDirectory + "/fleet-roster.json"
        certificatePath = stateDirectory + "/" + FleetService.certificateFile
        self.logger = logger
    }

    /// The box's certificate, as `boxkeyd fleet install-certificate` writes it (base64).
    public static let certificateFile = "fleet-certificate"

    /// Reads this box's certificate (if it has one) and the fleet's revocation list, and has
    /// the box serve them. A list that cannot be read keeps the one served before.
    func serveCertificate() async throws {
        guard FileManager.default.fileExists(atPath: certificatePath) else { return }
        var certificate: BoxCertificate?
        if let text = FileManager.default.contents(atPath: certificatePath).map({ String(decoding: $0, as: UTF8.self) }),
           let bytes = base64Decode(text), let c = try? BoxCertificate.decode(bytes) {
            certificate = c
        } else {
            logger.error("fleet: \(certificatePath) is not a box certificate")
        }
        let directory = directory
        let list = try await NIOThreadPool.singleton.runIfActive { try directory.readRevocations() }
        await box.fleetCertificate(certificate, revocations: list, now: Int64(Date().timeIntervalSince1970))
    }

    func run() async throws {
        do {
            if let cached = try FleetRoster.load(path: cachePath, sealedBy: box.identity.keyPair.privateKey) {
                await box.fleetCacheLoaded(cached)
                logger.info("fleet: \(cached.phones.count) phone(s) from the cache of \(cached.readAt.formatted(.iso8601)) until the directory answers")
            }
        } catch {
            logger.warning("fleet: \(error)")
        }
        let directory = directory, logger = logger
        await box.setFleetPublisher { key, user, name in
            Task {
                do {
                    // Only the account getpwnam gives for this exact name (a case-insensitive NSS,
                    // sssd against AD, gives `alice` for `Alice`), with its uid.
                    guard let pw = getpwnam(user), String(cString: pw.pointee.pw_name) == user else {
                        throw FleetDirectory.Failure(description: "this box has no account named exactly \(logSafe(user))")
                    }
                    let uid = pw.pointee.pw_uid
                    try await NIOThreadPool.singleton.runIfActive { try directory.add(key: key, name: name, user: user, localUID: uid) }
                    logger.notice("fleet: published phone \(key.fingerprint) for \(logSafe(user)) to the directory", metadata: ["audit": "true"])
                } catch {
                    logger.error("fleet: could not publish phone \(key.fingerprint) for \(logSafe(user)) to the directory (it is enrolled at this box only): \(error)")
                }
            }
        }
        var phonesBefore: Int?
        while !Task.isShuttingDownGracefully {
            let started = ContinuousClock.now
            var wait = directory.settings.refresh
            do {
                // libldap bounds each wait, not the whole read: a directory that drips bytes can
                // hold it for long. The box says so (status, log) while it waits.
                let box = box, limit = directory.settings.timeout * 4
                let watchdog = Task {
                    try await Task.sleep(for: limit)
                    await box.fleetReadFailed("no answer from the directory within \(limit.components.seconds) s (still waiting)")
                }
                defer { watchdog.cancel() }
                let (roster, requests, skipped) = try await NIOThreadPool.singleton.runIfActive { try directory.readRoster() }
                let took = ContinuousClock.now - started
                let seconds = Double(took.components.seconds) + Double(took.components.attoseconds) / 1e18
                await box.fleetRead(roster, requests: requests, seconds: seconds)
                if phonesBefore != roster.phones.count {
                    logger.info("fleet: read \(roster.phones.count) phone(s) from \(directory.settings.uri) in \((seconds * 100).rounded() / 100) s (\(requests) request(s))\(skipped > 0 ? "; skipped \(skipped) value(s): not phone keys, or past \(FleetRoster.maxValuesPerEntry) on one entry" : "")")
                    phonesBefore = roster.phones.count
                }
                do { try roster.save(path: cachePath, sealedBy: box.identity.keyPair.privateKey) } catch { logger.error("fleet: cannot write the cache \(cachePath): \(error)") }
                do { try await serveCertificate() } catch {
                    logger.warning("fleet: cannot read the revocation list at \(directory.settings.revocationsDN): \(error)")
                }
            } catch {
                await box.fleetReadFailed("\(error)")
                // Retry sooner than the refresh, not in a tight loop.
                wait = min(wait, .seconds(15))
            }
            let pause = wait
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: pause) }
        }
    }
}
