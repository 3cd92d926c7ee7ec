import BoxkeyCore
import BoxkeyPAMWire

/// What the admin socket asks of the box (`AdminSocket`): the phones, a revocation, a pairing
/// code or an enrolment, the status. The decisions are the state's; `Box` forwards.
extension BoxState {
    /// Admin: a fresh code (`boxkeyd pair-code`), for a headless box or a pre-enrolment at
    /// the box; with a user, the phone that proves it is enrolled for that user at once.
    mutating func newPairingCode(user: String, now: Duration) -> AdminReply {
        if !user.isEmpty, uid(of: user) == nil { return .error("no such user: \(user)") }
        if !user.isEmpty, !mayEnrol(user) { return .error(SystemUsers.rootRefusal) }
        let live = enrolment.mint(user: user.isEmpty ? nil : user, enrolsAtPairing: true, byAdmin: true, now: now)
        audit(.notice, .pairingCode, "pairing code issued by an admin\(user.isEmpty ? "" : " for user \(logSafe(user))")", user: user.isEmpty ? nil : user)
        return .text("Pairing code for box \(identity.boxID): \(live.code) (valid \(config.pairingCodeLifetime.components.seconds) s, \(live.triesLeft) tries)\(user.isEmpty ? "" : "; enrols the phone for \(user)")")
    }

    /// Admin: enrol a phone's key (64 hex digits) for a user without a code.
    mutating func enrolPhone(key: String, user: String, name: String) -> AdminReply {
        guard let bytes = unhex(key), let phone = try? PublicKey(bytes) else { return .error("a phone key is 64 hex digits (boxkey status shows it)") }
        guard !user.isEmpty, uid(of: user) != nil else { return .error("no such user: \(user)") }
        guard mayEnrol(user) else { return .error(SystemUsers.rootRefusal) }
        do {
            try registry.enrol(phone, user: user, name: name, by: "admin")
            audit(.notice, .enrolled, "enrolled: phone \(phone.fingerprint) for user \(logSafe(user)) by an admin", phone: phone.fingerprint, user: user)
            return .text("enrolled \(phone.fingerprint) for \(user)")
        } catch {
            return .error("\(error)")
        }
    }

    /// Admin: revokes the one phone `fingerprint` names, here or in the fleet directory: its
    /// pending enrolment and sealed passwords go with it. Returns the answer, and the key whose
    /// live links must end.
    mutating func revoke(fingerprint: String) -> (reply: AdminReply, phone: PublicKey?) {
        // A digit or two would pick some phone: revoking is for one the admin can name.
        guard fingerprint.filter({ $0 != "-" }).count >= 4 else { return (.error("give at least 4 hex digits of the fingerprint"), nil) }
        // The box's phones and the directory's together: the prefix must name exactly one, or
        // the admin, asked about one, could revoke another.
        let local = registry.phones.filter { Fingerprint.matches($0.fingerprint, prefix: fingerprint) }
        let fleetOnly = fleetPhones(fingerprint: fingerprint).filter { registry.phone($0.key) == nil }
        guard local.count + fleetOnly.count == 1 else {
            return (.error(local.isEmpty && fleetOnly.isEmpty ? "no phone with fingerprint \(fingerprint), here or in the fleet directory"
                           : "\(fingerprint) matches \(local.count + fleetOnly.count) phones (here and in the fleet directory); give more of the fingerprint"), nil)
        }
        let phone: PhoneRegistry.Phone
        do {
            if let fleetPhone = fleetOnly.first {
                // Known here only from the directory: revoked at this box whatever it says.
                phone = try registry.revoke(unknown: fleetPhone.key, name: fleetPhone.name)
            } else {
                phone = try registry.revoke(fingerprint: fingerprint)
            }
        } catch {
            return (.error("\(error)"), nil)
        }
        audit(.notice, .revoked, "revoked: phone \(phone.fingerprint) (\(logSafe(phone.name))) users \(phone.users.map(logSafe).joined(separator: ","))", phone: phone.fingerprint)
        let key = unhex(phone.key).flatMap { try? PublicKey($0) }
        if let key { enrolment.settle(key) }
        // Its sealed passwords go with it (escrow mode): nothing of it opens them any more.
        var destroyed = ""
        do {
            let n = try escrow.destroy(phone: phone.fingerprint)
            if n > 0 {
                destroyed = "; destroyed \(n) sealed password(s)"
                audit(.notice, .revoked, "destroyed \(n) sealed password(s) of revoked phone \(phone.fingerprint)", phone: phone.fingerprint)
            }
        } catch {
            log(.error, "could not destroy the sealed passwords of revoked phone \(phone.fingerprint): \(error)")
            destroyed = "; could NOT destroy its sealed passwords: \(error)"
        }
        return (.text("revoked \(phone.fingerprint) (\(phone.users.joined(separator: ",")), \(phone.name))\(destroyed)"), key)
    }

    /// What `boxkeyd status` shows.
    mutating func status(radio: String, lastReload: String?, now: Duration) -> DaemonStatus {
        let code = enrolment.current(now: now)
        return DaemonStatus(
            version: BoxkeyRelease.description, boxID: identity.boxID.description, fingerprint: identity.fingerprint,
            publicKey: hex(identity.keyPair.publicKey.bytes), radio: radio, connections: links.count,
            prompts: prompts.waiting.map(\.description),
            pairing: .init(live: code != nil, expiresInSeconds: code.map { Int(($0.expires - now).components.seconds) },
                           triesLeft: code?.triesLeft, pendingPhones: enrolment.pendingCount),
            sessions: registered.entries.values.map { .init(id: $0.session.id, user: $0.session.user, place: $0.session.place) }
                .sorted { $0.id < $1.id },
            presence: presences.values.map { .init(user: $0.user, phone: $0.phone.fingerprint) }.sorted { $0.user < $1.user },
            grace: graces.values.map(\.user).sorted(),
            enrolledPhones: registry.phones.filter(\.enrolled).count, revokedPhones: registry.phones.filter(\.revoked).count,
            login: .init(mode: config.loginMode.rawValue, keyUsers: config.keyUsers.sorted(), escrowUsers: config.escrowUsers.sorted(),
                         sealedPasswords: escrow.records.count, proximity: config.proximity,
                         keyServices: config.keyServices.intersection(config.phoneLoginServices).sorted()),
            fleet: fleetStatus(), lastReload: lastReload)
    }
}

extension Box {
    public func newPairingCode(user: String) -> AdminReply { state.newPairingCode(user: user, now: clock.now) }

    public func enrolPhone(key: String, user: String, name: String) -> AdminReply { state.enrolPhone(key: key, user: user, name: name) }

    /// The enrolled and revoked phones, as JSON (`boxkeyd phones list` renders them).
    public func phoneList() -> String { AdminJSON.encode(state.registry.phones) }

    /// Revokes a phone; its live links end, a presence link's as a walk-away does.
    public func revoke(fingerprint: String) -> AdminReply {
        let (reply, phone) = state.revoke(fingerprint: fingerprint)
        if let phone { state.endLinks(of: phone, reason: "phone revoked at this box", now: clock.now) }
        return reply
    }

    /// What the last reload did (`boxkeyd status`).
    public func reloaded(_ outcome: String) { lastReload = outcome }

    /// The radio came (attached), or the box waits for it (what for, in `description`).
    public func radioChanged(_ description: String, attached: Bool) {
        radioDescription = description
        radioAttached = attached
    }

    /// What `boxkeyd status` shows, as JSON.
    public func status() -> DaemonStatus { state.status(radio: radioDescription, lastReload: lastReload, now: clock.now) }
}
