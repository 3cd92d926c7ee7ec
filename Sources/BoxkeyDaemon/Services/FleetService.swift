import BoxkeyCore
import FoundationEssentials
import Glibc
import Logging
import NIOPosix
import ServiceLifecycle

/// Keeps the box's roster as the fleet directory says: it follows the directory's changes as
/// they happen (RFC 4533 refreshAndPersist, OpenLDAP's syncprov), or, where the server refuses
/// that or `[fleet] follow = false`, reads the whole roster every `[fleet] refresh_s`. Keeps the
/// last roster in `<state>/fleet-roster.json` (sealed under the box's key) for a restart while
/// the directory is away; and publishes phones enrolled here when `[fleet] publish` is on.
/// Directory calls block, so they run on threads, never on the box's actor: the stream on a
/// thread of its own (it waits on its socket for as long as the directory is quiet).
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

    /// Reads this box's certificate (if it has one) and the fleet's revocation list (by
    /// `read`), and has the box serve them. A list that cannot be read keeps the one served before.
    func serveCertificate(_ read: () async throws -> BoxRevocationList?) async {
        guard FileManager.default.fileExists(atPath: certificatePath) else { return }
        var certificate: BoxCertificate?
        if let text = FileManager.default.contents(atPath: certificatePath).map({ String(decoding: $0, as: UTF8.self) }),
           let bytes = base64Decode(text), let c = try? BoxCertificate.decode(bytes) {
            certificate = c
        } else {
            logger.error("fleet: \(certificatePath) is not a box certificate")
        }
        do {
            let list = try await read()
            await box.fleetCertificate(certificate, revocations: list, now: Int64(Date().timeIntervalSince1970))
        } catch {
            logger.warning("fleet: cannot read the revocation list at \(directory.settings.revocationsDN): \(error)")
        }
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
        // Publishing (`[fleet] publish`) runs beside the reads, one phone after another.
        let (publications, publication) = AsyncStream.makeStream(of: (key: PublicKey, user: String, name: String).self)
        await box.setFleetPublisher { key, user, name in publication.yield((key, user, name)) }
        await withDiscardingTaskGroup { group in
            group.addTask { for await p in publications { await publish(p.key, user: p.user, name: p.name) } }
            await readUntilShutdown()
            publication.finish()
        }
    }

    /// Reads the directory until shutdown: following its changes, or reading it whole.
    private func readUntilShutdown() async {
        let pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        defer { pool.shutdownGracefully { _ in } }
        var follow = directory.settings.follow
        var retry: Duration = .seconds(1)
        // A refusal of the stream (a server briefly without syncprov, a failover to one that
        // lacks it) is tried again, less and less often: following turns back on by itself.
        var followAgain: (at: ContinuousClock.Instant, after: Duration)?
        var phonesBefore: Int?
        let every = "every \(directory.settings.refresh.components.seconds) s"
        await box.fleetMode(follow ? "following the directory's changes (RFC 4533)" : "reading the whole roster \(every) ([fleet] follow = false)")
        while !Task.isShuttingDownGracefully {
            var pause = directory.settings.refresh
            if follow {
                do {
                    try await followChanges(on: pool, phonesBefore: &phonesBefore) {
                        retry = .seconds(1)
                        followAgain = nil
                        await box.fleetMode("following the directory's changes (RFC 4533)")
                    }
                    continue  // the hourly whole refresh: at once
                } catch let failure as FleetDirectory.Failure where failure.code == LDAP_UNAVAILABLE_CRITICAL_EXTENSION_CODE {
                    let after = min((followAgain?.after ?? .seconds(5)) * 2, .seconds(900))  // 10 s, 20 s, ... 15 min
                    followAgain = (ContinuousClock.now + after, after)
                    logger.warning("fleet: \(directory.settings.uri) does not offer content synchronisation (RFC 4533; OpenLDAP: the syncprov overlay, docs/fleet.md): reading the whole roster \(every) instead, and asking again in \(after.components.seconds) s")
                    await box.fleetMode("reading the whole roster \(every): the directory refused content synchronisation (asking again in \(after.components.seconds) s)")
                    follow = false
                    continue
                } catch {
                    if Task.isShuttingDownGracefully { break }
                    await box.fleetReadFailed("\(error)")
                    // Back soon after a restart of the directory, not in a tight loop.
                    pause = retry
                    retry = min(retry * 2, .seconds(15))
                }
            } else {
                pause = await readWhole(phonesBefore: &phonesBefore)
                if let again = followAgain, ContinuousClock.now >= again.at {
                    follow = true
                    continue
                }
            }
            let wait = pause
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: wait) }
        }
    }

    /// With `[fleet] publish`: writes a phone enrolled here to its user's entry.
    private func publish(_ key: PublicKey, user: String, name: String) async {
        do {
            // Only the account getpwnam gives for this exact name (a case-insensitive NSS,
            // sssd against AD, gives `alice` for `Alice`), with its uid.
            guard let pw = getpwnam(user), String(cString: pw.pointee.pw_name) == user else {
                throw FleetDirectory.Failure(description: "this box has no account named exactly \(logSafe(user))")
            }
            let uid = pw.pointee.pw_uid, directory = directory
            try await NIOThreadPool.singleton.runIfActive { try directory.add(key: key, name: name, user: user, localUID: uid) }
            logger.notice("fleet: published phone \(key.fingerprint) for \(logSafe(user)) to the directory", metadata: ["audit": "true"])
        } catch {
            logger.error("fleet: could not publish phone \(key.fingerprint) for \(logSafe(user)) to the directory (it is enrolled at this box only): \(error)")
        }
    }

    /// One whole read of the roster (polling); returns the pause before the next.
    private func readWhole(phonesBefore: inout Int?) async -> Duration {
        let started = ContinuousClock.now
        do {
            // libldap bounds each wait, not the whole read: a directory that drips bytes can
            // hold it for long. The box says so (status, log) while it waits.
            let box = box, limit = directory.settings.timeout * 4, directory = directory
            let (roster, requests, skipped) = try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    try await Task.sleep(for: limit)
                    await box.fleetReadFailed("no answer from the directory within \(limit.components.seconds) s (still waiting)")
                }
                defer { group.cancelAll() }
                return try await NIOThreadPool.singleton.runIfActive { try directory.readRoster() }
            }
            await took(roster, requests: requests, skipped: skipped, since: started, phonesBefore: &phonesBefore, how: "")
            await serveCertificate { try await NIOThreadPool.singleton.runIfActive { try directory.readRevocations() } }
            return directory.settings.refresh
        } catch {
            await box.fleetReadFailed("\(error)")
            // Retry sooner than the refresh, not in a tight loop.
            return min(directory.settings.refresh, .seconds(15))
        }
    }

    /// Caches a roster (first: a restart must not bring back what it took away), hands it to
    /// the box, and logs it when its size changed. `cache` false: the caller saves it soon,
    /// once for a burst of changes.
    private func took(_ roster: FleetRoster, requests: Int, skipped: Int, since started: ContinuousClock.Instant, phonesBefore: inout Int?, how: String,
                      cache: Bool = true) async {
        if cache { save(roster) }
        let took = ContinuousClock.now - started
        let seconds = Double(took.components.seconds) + Double(took.components.attoseconds) / 1e18
        await box.fleetRead(roster, requests: requests, seconds: seconds)
        if phonesBefore != roster.phones.count {
            logger.info("fleet: read \(roster.phones.count) phone(s) from \(directory.settings.uri) in \((seconds * 100).rounded() / 100) s (\(requests) request(s))\(how)\(skipped > 0 ? "; skipped \(skipped) value(s): not phone keys, or past \(FleetRoster.maxValuesPerEntry) on one entry" : "")")
            phonesBefore = roster.phones.count
        }
    }

    private func save(_ roster: FleetRoster) {
        do { try roster.save(path: cachePath, sealedBy: box.identity.keyPair.privateKey) } catch {
            // The old file may vouch for what the directory has taken away since: it goes.
            unlink(cachePath)
            logger.error("fleet: cannot write the cache \(cachePath) (removed it): \(error)")
        }
    }

    /// Follows the directory until shutdown or the next whole refresh is due (returns), or until
    /// the stream fails (throws; the code says whether the server refused it). `refreshed` is
    /// called once the whole set is in.
    private func followChanges(on pool: NIOThreadPool, phonesBefore: inout Int?, refreshed: () async -> Void) async throws {
        let follower = FleetFollower(directory: directory)
        defer { follower.close() }
        let settings = directory.settings
        // Each call waits on the thread; a graceful shutdown or a cancellation wakes it
        // (`interrupt`, which also fails every later call). Handlers, not a task group per
        // call: a stream of changes makes thousands of calls.
        func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
            try await withGracefulShutdownHandler {
                try await withTaskCancellationHandler { try await pool.runIfActive(body) } onCancel: { follower.interrupt() }
            } onGracefulShutdown: { follower.interrupt() }
        }
        // `searched`: as FleetMirror.searched gives (nil: every name followed).
        func lookUp(_ searched: Set<String>?, in mirror: inout FleetMirror) async throws -> Int {
            let (all, besides) = (searched ?? mirror.names, mirror.followedDNs)
            let (found, requests) = try await blocking { try follower.lookalikes(of: all, besides: besides) }
            mirror.lookedUp(searched, found: found)
            return requests
        }
        func checkLimits(_ mirror: FleetMirror) throws {
            guard mirror.count <= FleetDirectory.maxEntries, mirror.containers <= FleetDirectory.maxEntries else {
                throw FleetDirectory.Failure(description: "more than \(FleetDirectory.maxEntries) entries with phones (or containers) under \(settings.base)")
            }
        }
        let started = ContinuousClock.now
        // A whole refresh now and then (an hour, give or take, so boxes started together spread
        // out) finds what the stream cannot tell: a look-alike made without phones, a subtree
        // moved out of the base below a container the stream does not follow.
        let resyncAt = started + .seconds(Int64.random(in: 3240...3960))
        try await blocking { try follower.start() }
        var mirror = FleetMirror()
        var reported = false, heard = started
        while !mirror.refreshed {
            let changes = try await blocking { try follower.next(timeout: settings.timeout) }
            if !changes.isEmpty { heard = ContinuousClock.now }
            guard ContinuousClock.now - heard < settings.timeout * 4 else {
                throw FleetDirectory.Failure(description: "no answer from the directory within \((settings.timeout * 4).components.seconds) s")
            }
            _ = mirror.apply(changes)
            try checkLimits(mirror)
            // libldap bounds each wait, not a refresh that drips: the box says so meanwhile.
            if !reported, ContinuousClock.now - started > settings.timeout * 4 {
                await box.fleetReadFailed("the directory's refresh has not finished within \((settings.timeout * 4).components.seconds) s (still reading)")
                reported = true
            }
        }
        let lookups = try await lookUp(nil, in: &mirror)
        var (roster, skipped) = mirror.roster(readAt: Date())
        await took(roster, requests: 1 + lookups, skipped: skipped, since: started, phonesBefore: &phonesBefore, how: "; following its changes")
        await refreshed()
        await serveCertificate { try await blocking { try follower.readRevocations() } }
        var lastPing = ContinuousClock.now
        // After a change that only adds, the cache is written a second later, once for a burst
        // of them; after one that takes a phone away, at once (a restart must not bring it back).
        var saveAt: ContinuousClock.Instant?
        while !Task.isShuttingDownGracefully {
            let now = ContinuousClock.now
            guard now < resyncAt else { break }
            let wait = max(.zero, min(settings.refresh - (now - lastPing), (saveAt ?? resyncAt) - now, resyncAt - now))
            let changes: [FleetMirror.Change]
            do { changes = try await blocking { try follower.next(timeout: wait) } } catch {
                if saveAt != nil { save(roster) }
                throw error
            }
            let changed = ContinuousClock.now
            if let due = saveAt, changed >= due {
                save(roster)
                saveAt = nil
            }
            let (anything, names) = mirror.apply(changes)
            if anything {
                // First as the change says, with the names still to be looked up vouching for
                // nobody: a revocation is acted on and cached whatever the look-ups do.
                let searched = FleetMirror.searched(names)
                let previous = roster
                (roster, skipped) = mirror.roster(readAt: Date(), withholding: searched)
                let lost = !roster.lost(since: previous).isEmpty || roster.uidNumbers != previous.uidNumbers
                await took(roster, requests: 0, skipped: skipped, since: changed, phonesBefore: &phonesBefore, how: " after a change there", cache: lost)
                saveAt = lost ? nil : saveAt ?? changed + .seconds(1)
                if !searched.isEmpty {
                    let requests = try await lookUp(searched, in: &mirror)
                    (roster, skipped) = mirror.roster(readAt: Date())
                    await took(roster, requests: requests, skipped: skipped, since: changed, phonesBefore: &phonesBefore, how: " after a change there", cache: false)
                    saveAt = saveAt ?? changed + .seconds(1)
                }
                try checkLimits(mirror)
            }
            guard ContinuousClock.now - lastPing >= settings.refresh else { continue }
            // A quiet stream and a dead connection look the same: a one-entry read tells them
            // apart (bounded by timeout_s), and keeps the roster fresh for max_stale_s.
            try await blocking { try follower.ping() }
            lastPing = ContinuousClock.now
            (roster, skipped) = mirror.roster(readAt: Date())
            await took(roster, requests: 1, skipped: skipped, since: lastPing, phonesBefore: &phonesBefore, how: "")
            saveAt = nil
            await serveCertificate { try await blocking { try follower.readRevocations() } }
        }
        if saveAt != nil { save(roster) }
    }
}

/// unavailableCriticalExtension: the server does not do what a critical control asks.
let LDAP_UNAVAILABLE_CRITICAL_EXTENSION_CODE: Int32 = 12
