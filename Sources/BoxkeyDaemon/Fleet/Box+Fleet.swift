import BoxkeyCore
import FoundationEssentials

/// What the box knows of its last reads of the fleet directory (`boxkeyd status`).
struct FleetHealth: Sendable {
    var lastRead: Date?
    var lastReadSeconds: Double?
    var lastReadRequests = 0
    var lastError: String?
    var failingSince: Date?
}

extension Box {
    /// The users `phone` may log in as here: its enrolment at this box, and the fleet
    /// directory's while the last read of it is fresh enough. A phone revoked at this box gets
    /// nothing from the directory either.
    func enrolledUsers(of phone: PublicKey, now: Date = Date()) -> [String] {
        let local = registry.users(of: phone)
        guard let fleet = config.fleet, let roster = fleetRoster, !registry.isRevoked(phone) else { return local }
        let fromFleet = roster.users(of: phone, now: now, maxStale: fleet.maxStale)
        return local + fromFleet.filter { !local.contains($0) }
    }

    /// With `[fleet] publish`, a phone enrolled here by a pairing code is written to the
    /// user's directory entry, so every box of the fleet takes it.
    func publishToFleet(_ phone: PublicKey, user: String, name: String) {
        guard config.fleet?.publish == true, let fleetPublisher else { return }
        fleetPublisher(phone, user, name)
    }

    public func setFleetPublisher(_ publisher: @escaping @Sendable (PublicKey, String, String) -> Void) {
        fleetPublisher = publisher
    }

    /// The roster from the cache file at start: used only while it is fresh.
    public func fleetCacheLoaded(_ roster: FleetRoster) {
        fleetRoster = roster
        fleetHealth.lastRead = roster.readAt
    }

    /// A new read of the directory. Phones that lost users there lose their links here at once
    /// (as `boxkeyd phones revoke` does), unless this box enrolled them itself.
    public func fleetRead(_ roster: FleetRoster, requests: Int, seconds: Double) {
        let old = fleetRoster
        fleetRoster = roster
        if fleetHealth.failingSince != nil {
            audit.audit(.notice, .fleet, "fleet directory answers again: \(roster.phones.count) phones (it had failed since \(fleetHealth.failingSince!.formatted(.iso8601)))")
        }
        fleetHealth = FleetHealth(lastRead: roster.readAt, lastReadSeconds: seconds, lastReadRequests: requests)
        guard let old else { return }
        for (key, users) in roster.lost(since: old) {
            guard let bytes = unhex(key), let phone = try? PublicKey(bytes) else { continue }
            audit.audit(.notice, .revoked, "fleet: phone \(phone.fingerprint) is no longer enrolled for \(users.map(logSafe).joined(separator: ",")) in the directory", phone: phone.fingerprint)
            let still = enrolledUsers(of: phone)
            for (id, link) in links where link.connection.phoneKey == phone {
                let user = presences[id]?.user
                guard still.isEmpty || user.map({ !still.contains($0) }) == true else { continue }
                presences[id] = nil
                drop(id)
            }
        }
    }

    /// A failed read: the roster stays in use until `[fleet] max_stale_s` after the last good
    /// read, then fleet phones are refused.
    public func fleetReadFailed(_ error: String, now: Date = Date()) {
        if fleetHealth.failingSince == nil {
            let left = fleetHealth.lastRead.map { max(0, Double(config.fleet?.maxStale.components.seconds ?? 0) - now.timeIntervalSince($0)) }
            let until = left.map { "fleet phones keep working from the last read for \(Int($0)) s more" } ?? "no read of it yet: fleet phones are refused"
            audit.audit(.warning, .fleet, "cannot read the fleet directory: \(error); \(until); passwords work as always")
            fleetHealth.failingSince = now
        }
        fleetHealth.lastError = error
    }

    func fleetStatus(now: Date = Date()) -> DaemonStatus.Fleet? {
        guard let fleet = config.fleet else { return nil }
        let age = fleetHealth.lastRead.map { Int(now.timeIntervalSince($0)) }
        return DaemonStatus.Fleet(uri: fleet.uri, phones: fleetRoster?.phones.count ?? 0, lastReadAgeSeconds: age,
                                  fresh: fleetRoster?.isFresh(now: now, maxStale: fleet.maxStale) ?? false,
                                  maxStaleSeconds: Int(fleet.maxStale.components.seconds), error: fleetHealth.lastError,
                                  publish: fleet.publish)
    }
}
