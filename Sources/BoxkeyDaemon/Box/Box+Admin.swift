import BoxkeyCore
import BoxkeyPAMWire

/// What the admin socket asks of the box (`AdminSocket`): the phones, a revocation, a pairing
/// code or an enrolment, the status.
extension Box {
    /// Admin: a fresh code (`boxkeyd pair-code`), for a headless box or a pre-enrolment at
    /// the box; with a user, the phone that proves it is enrolled for that user at once.
    public func newPairingCode(user: String) -> AdminReply {
        if !user.isEmpty, uid(of: user) == nil { return .error("no such user: \(user)") }
        if !user.isEmpty, !state.mayEnrol(user) { return .error(Self.rootRefusal) }
        let live = state.enrolment.mint(user: user.isEmpty ? nil : user, enrolsAtPairing: true, byAdmin: true, now: clock.now)
        audit.audit(.notice, .pairingCode, "pairing code issued by an admin\(user.isEmpty ? "" : " for user \(logSafe(user))")", user: user.isEmpty ? nil : user)
        return .text("Pairing code for box \(identity.boxID): \(live.code) (valid \(state.config.pairingCodeLifetime.components.seconds) s, \(live.triesLeft) tries)\(user.isEmpty ? "" : "; enrols the phone for \(user)")")
    }

    /// Admin: enrol a phone's key (64 hex digits) for a user without a code.
    public func enrolPhone(key: String, user: String, name: String) -> AdminReply {
        guard let bytes = unhex(key), let phone = try? PublicKey(bytes) else { return .error("a phone key is 64 hex digits (boxkey status shows it)") }
        guard !user.isEmpty, uid(of: user) != nil else { return .error("no such user: \(user)") }
        guard state.mayEnrol(user) else { return .error(Self.rootRefusal) }
        do {
            try state.registry.enrol(phone, user: user, name: name, by: "admin")
            audit.audit(.notice, .enrolled, "enrolled: phone \(phone.fingerprint) for user \(logSafe(user)) by an admin", phone: phone.fingerprint, user: user)
            return .text("enrolled \(phone.fingerprint) for \(user)")
        } catch {
            return .error("\(error)")
        }
    }

    /// The enrolled and revoked phones, as JSON (`boxkeyd phones list` renders them).
    public func phoneList() -> String { AdminJSON.encode(state.registry.phones) }

    public func revoke(fingerprint: String) async -> AdminReply {
        // A digit or two would pick some phone: revoking is for one the admin can name.
        guard fingerprint.filter({ $0 != "-" }).count >= 4 else { return .error("give at least 4 hex digits of the fingerprint") }
        // The box's phones and the directory's together: the prefix must name exactly one, or
        // the admin, asked about one, could revoke another.
        let local = state.registry.phones.filter { Fingerprint.matches($0.fingerprint, prefix: fingerprint) }
        let fleetOnly = state.fleetPhones(fingerprint: fingerprint).filter { state.registry.phone($0.key) == nil }
        guard local.count + fleetOnly.count == 1 else {
            return .error(local.isEmpty && fleetOnly.isEmpty ? "no phone with fingerprint \(fingerprint), here or in the fleet directory"
                          : "\(fingerprint) matches \(local.count + fleetOnly.count) phones (here and in the fleet directory); give more of the fingerprint")
        }
        do {
            let phone: PhoneRegistry.Phone
            if let fleetPhone = fleetOnly.first {
                // Known here only from the directory: revoked at this box whatever it says.
                phone = try state.registry.revoke(unknown: fleetPhone.key, name: fleetPhone.name)
            } else {
                phone = try state.registry.revoke(fingerprint: fingerprint)
            }
            audit.audit(.notice, .revoked, "revoked: phone \(phone.fingerprint) (\(logSafe(phone.name))) users \(phone.users.map(logSafe).joined(separator: ","))", phone: phone.fingerprint)
            // Drop its live links: a revoked phone keeps nothing.
            if let bytes = unhex(phone.key), let key = try? PublicKey(bytes) {
                await endLinks(of: key, reason: "phone revoked at this box")
                state.enrolment.settle(key)
            }
            // Its sealed passwords go with it (escrow mode): nothing of it opens them any more.
            var destroyed = ""
            do {
                let n = try state.escrow.destroy(phone: phone.fingerprint)
                if n > 0 {
                    destroyed = "; destroyed \(n) sealed password(s)"
                    audit.audit(.notice, .revoked, "destroyed \(n) sealed password(s) of revoked phone \(phone.fingerprint)", phone: phone.fingerprint)
                }
            } catch {
                logger.error("could not destroy the sealed passwords of revoked phone \(phone.fingerprint): \(error)")
                destroyed = "; could NOT destroy its sealed passwords: \(error)"
            }
            return .text("revoked \(phone.fingerprint) (\(phone.users.joined(separator: ",")), \(phone.name))\(destroyed)")
        } catch {
            return .error("\(error)")
        }
    }

    /// What the last reload did (`boxkeyd status`).
    public func reloaded(_ outcome: String) { lastReload = outcome }

    /// The radio came (attached), or the box waits for it (what for, in `description`).
    public func radioChanged(_ description: String, attached: Bool) {
        radioDescription = description
        radioAttached = attached
    }

    /// What `boxkeyd status` shows, as JSON.
    public func status() -> DaemonStatus {
        let now = clock.now
        let code = state.enrolment.current(now: now)
        return DaemonStatus(
            version: BoxkeyRelease.description, boxID: identity.boxID.description, fingerprint: identity.fingerprint,
            publicKey: hex(identity.keyPair.publicKey.bytes), radio: radioDescription, connections: state.links.count,
            prompts: state.prompts.waiting.map(\.description),
            pairing: .init(live: code != nil, expiresInSeconds: code.map { Int(($0.expires - now).components.seconds) },
                           triesLeft: code?.triesLeft, pendingPhones: state.enrolment.pendingCount),
            sessions: state.registered.entries.values.map { .init(id: $0.session.id, user: $0.session.user, place: $0.session.place) }
                .sorted { $0.id < $1.id },
            presence: state.presences.values.map { .init(user: $0.user, phone: $0.phone.fingerprint) }.sorted { $0.user < $1.user },
            grace: state.graces.values.map(\.user).sorted(),
            enrolledPhones: state.registry.phones.filter(\.enrolled).count, revokedPhones: state.registry.phones.filter(\.revoked).count,
            login: .init(mode: state.config.loginMode.rawValue, keyUsers: state.config.keyUsers.sorted(), escrowUsers: state.config.escrowUsers.sorted(),
                         sealedPasswords: state.escrow.records.count, proximity: state.config.proximity,
                         keyServices: state.config.keyServices.intersection(state.config.phoneLoginServices).sorted()),
            fleet: fleetStatus(), lastReload: lastReload)
    }
}
