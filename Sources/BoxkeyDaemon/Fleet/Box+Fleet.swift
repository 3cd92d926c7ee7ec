import BoxkeyCore
import FoundationEssentials

/// What the box knows of its last reads of the fleet directory (`boxkeyd status`).
struct FleetHealth: Sendable {
    var lastRead: Date?
    var lastReadSeconds: Double?
    var lastReadRequests = 0
    var lastError: String?
    var failingSince: Date?
    var certificate: BoxCertificate?
    var certificateProblem: String?
    /// What Info serves now, as logged (a change is logged once).
    var served: String?
    /// How the box reads the directory now, for people (`boxkeyd status`, doctor).
    var mode: String?
}

extension BoxState {
    /// The users `phone` may log in as here: its enrolment at this box, and the fleet
    /// directory's while the last read of it is fresh enough. A phone revoked at this box gets
    /// nothing from the directory either.
    func enrolledUsers(of phone: PublicKey) -> [String] {
        let local = registry.users(of: phone)
        guard let fleet = config.fleet, let roster = fleetRoster, !registry.isRevoked(phone) else { return local }
        // A user the box knows, not root, with the uid the directory gives (where it gives one).
        let fromFleet = roster.users(of: phone, now: wallClock(), maxStale: fleet.maxStale).filter { user in
            // The account of exactly that name: a case-insensitive NSS (sssd) gives `Alice`, a
            // different person, for the directory's `alice`.
            guard let uid = uid(of: user), uid != 0, SystemUsers.accountName(user).map({ $0 == user }) ?? true else { return false }
            return roster.uidNumbers[user].map { $0 == uid } ?? true
        }
        return local + fromFleet.filter { !local.contains($0) }
    }

    /// The fleet phones whose fingerprint starts with `fingerprint` (for a local revocation).
    func fleetPhones(fingerprint: String) -> [(key: PublicKey, name: String)] {
        guard let roster = fleetRoster else { return [] }
        return roster.phones.compactMap { k, p -> (PublicKey, String)? in
            guard let bytes = unhex(k), let key = try? PublicKey(bytes), Fingerprint.matches(key.fingerprint, prefix: fingerprint) else { return nil }
            return (key, p.name)
        }
    }

    /// With `[fleet] publish`, a phone enrolled here by a pairing code is written to the
    /// user's directory entry, so every box of the fleet takes it.
    mutating func publishToFleet(_ phone: PublicKey, user: String, name: String) {
        guard config.fleet?.publish == true else { return }
        emit(.publish(phone, user: user, name: name))
    }

    /// The roster from the cache file at start: used only while it is fresh.
    mutating func fleetCacheLoaded(_ roster: FleetRoster) {
        fleetRoster = roster
        fleetHealth.lastRead = roster.readAt
    }

    /// A new read of the directory. Phones that lost users there lose their links here at once
    /// (as `boxkeyd phones revoke` does), unless this box enrolled them itself.
    mutating func fleetRead(_ roster: FleetRoster, requests: Int, seconds: Double) -> [(phone: PublicKey, keeping: [String])] {
        let old = fleetRoster
        fleetRoster = roster
        if fleetHealth.failingSince != nil {
            audit(.notice, .fleet, "fleet directory answers again: \(roster.phones.count) phones (it had failed since \(fleetHealth.failingSince!.formatted(.iso8601)))")
        }
        fleetHealth.lastRead = roster.readAt
        fleetHealth.lastReadSeconds = seconds
        fleetHealth.lastReadRequests = requests
        fleetHealth.lastError = nil
        fleetHealth.failingSince = nil
        guard let old else { return [] }
        var lost: [(phone: PublicKey, keeping: [String])] = []
        for (key, users) in roster.lost(since: old) {
            guard let bytes = unhex(key), let phone = try? PublicKey(bytes) else { continue }
            audit(.notice, .revoked, "fleet: phone \(phone.fingerprint) is no longer enrolled for \(users.map(logSafe).joined(separator: ",")) in the directory", phone: phone.fingerprint)
            let still = enrolledUsers(of: phone)
            if still.isEmpty {
                // Enrolled nowhere now: as a local revocation, its pending enrolment goes, and
                // so do its sealed passwords (escrow mode).
                enrolment.settle(phone)
                if let n = try? escrow.destroy(phone: phone.fingerprint), n > 0 {
                    audit(.notice, .revoked, "destroyed \(n) sealed password(s) of phone \(phone.fingerprint), no longer enrolled in the directory", phone: phone.fingerprint)
                }
            }
            lost.append((phone, still))
        }
        return lost
    }

    /// A failed read: the roster stays in use until `[fleet] max_stale_s` after the last good
    /// read, then fleet phones are refused.
    mutating func fleetReadFailed(_ error: String) {
        let now = wallClock()
        if fleetHealth.failingSince == nil {
            let left = fleetHealth.lastRead.map { max(0, Double(config.fleet?.maxStale.components.seconds ?? 0) - now.timeIntervalSince($0)) }
            let until = left.map { "fleet phones keep working from the last read for \(Int($0)) s more" } ?? "no read of it yet: fleet phones are refused"
            audit(.warning, .fleet, "cannot read the fleet directory: \(error); \(until); passwords work as always")
            fleetHealth.failingSince = now
        }
        fleetHealth.lastError = error
    }

    func fleetStatus() -> DaemonStatus.Fleet? {
        guard let fleet = config.fleet else { return nil }
        let now = wallClock()
        let age = fleetHealth.lastRead.map { Int(now.timeIntervalSince($0)) }
        return DaemonStatus.Fleet(uri: fleet.uri, phones: fleetRoster?.phones.count ?? 0, lastReadAgeSeconds: age,
                                  fresh: fleetRoster?.isFresh(now: now, maxStale: fleet.maxStale) ?? false,
                                  maxStaleSeconds: Int(fleet.maxStale.components.seconds), error: fleetHealth.lastError,
                                  publish: fleet.publish,
                                  certificate: fleetHealth.certificate.map { .init(serial: String($0.serial, radix: 16), notAfter: Date(timeIntervalSince1970: Double($0.notAfter))) },
                                  certificateProblem: fleetHealth.certificateProblem, mode: fleetHealth.mode)
    }

    /// How the box reads the directory now (following, or reading whole and why).
    mutating func fleetMode(_ mode: String) {
        fleetHealth.mode = mode
    }

    /// This box's fleet certificate and the fleet's revocation list, for Info; phones read it
    /// before taking a box they have not pinned. Checked against this box first: a certificate
    /// for another key or ID is not served; one expired or revoked, or a list missing or
    /// expired, is served (phones refuse it, saying why) and logged as an error here.
    mutating func fleetCertificate(_ certificate: BoxCertificate?, revocations: BoxRevocationList?, now: Int64) {
        var problem: String?
        if let c = certificate {
            if c.boxKey != identity.keyPair.publicKey || c.boxID != identity.boxID {
                problem = "the fleet certificate is for box \(c.boxID) with key \(c.boxKey.fingerprint), not this box (\(identity.boxID), \(identity.fingerprint))"
            } else if now > c.notAfter {
                problem = "this box's fleet certificate expired at \(c.notAfter) (Unix time): certify it again (boxkeyd fleet certify)"
            } else if revocations?.serials.contains(c.serial) == true {
                problem = "this box's fleet certificate is REVOKED in the fleet's list"
            } else if revocations == nil {
                problem = "no revocation list at [fleet] revocations_dn: phones refuse a certified box without a current one"
            } else if let r = revocations, now > r.nextUpdate {
                problem = "the fleet's revocation list expired at \(r.nextUpdate) (Unix time): phones refuse this box until the admin signs a new one"
            }
        }
        let served = certificate.map { "\(String($0.serial, radix: 16)) (valid until \($0.notAfter)) and revocation list \(revocations?.number ?? 0)" }
        if problem != fleetHealth.certificateProblem || served != fleetHealth.served {
            if let problem { audit(.error, .fleet, "fleet: \(problem)") }
            else if let served { audit(.notice, .fleet, "fleet: serving certificate \(served)") }
            fleetHealth.certificateProblem = problem
            fleetHealth.served = served
        }
        fleetHealth.certificate = certificate
        var credentials: [UInt8] = []
        if let c = certificate, c.boxKey == identity.keyPair.publicKey, c.boxID == identity.boxID {
            credentials = c.encode() + (revocations?.encode() ?? [])
        }
        guard credentials != fleetCredentials else { return }
        fleetCredentials = credentials
        emit(.radio(.setInfo(info.encode())))
    }
}

extension Box {
    public func setFleetPublisher(_ publisher: @escaping @Sendable (PublicKey, String, String) -> Void) {
        fleetPublisher = publisher
    }

    /// The roster from the cache file at start: used only while it is fresh.
    public func fleetCacheLoaded(_ roster: FleetRoster) { state.fleetCacheLoaded(roster) }

    /// A new read of the directory. Phones that lost users there lose their links here at once
    /// (as `boxkeyd phones revoke` does), unless this box enrolled them itself.
    public func fleetRead(_ roster: FleetRoster, requests: Int, seconds: Double) {
        for (phone, still) in state.fleetRead(roster, requests: requests, seconds: seconds) {
            state.endLinks(of: phone, keeping: still, reason: "phone revoked in the fleet directory", now: clock.now)
        }
    }

    /// A failed read: the roster stays in use until `[fleet] max_stale_s` after the last good
    /// read, then fleet phones are refused.
    public func fleetReadFailed(_ error: String) { state.fleetReadFailed(error) }

    /// How the box reads the directory now (`boxkeyd status`).
    public func fleetMode(_ mode: String) { state.fleetMode(mode) }

    /// This box's fleet certificate and the fleet's revocation list, for Info.
    public func fleetCertificate(_ certificate: BoxCertificate?, revocations: BoxRevocationList?, now: Int64) {
        state.fleetCertificate(certificate, revocations: revocations, now: now)
    }
}
