import BoxkeyCore

/// What the box guards, kept across a restart of the daemon (`GuardRecord`, `GuardFile`).
extension BoxState {
    /// The guarded state now: sessions on record, phones present or in their grace time,
    /// users locked.
    var guardRecord: GuardRecord {
        var record = GuardRecord()
        record.sessions = registered.entries.values.map {
            GuardRecord.Session(id: $0.session.id, uid: $0.session.uid, user: $0.session.user, service: $0.service, phone: $0.phone.map { hex($0.bytes) })
        }.sorted { $0.id < $1.id }
        let present = presences.values.map { GuardRecord.Presence(phone: hex($0.phone.bytes), user: $0.user) }
            + graces.map { GuardRecord.Presence(phone: hex($0.key.bytes), user: $0.value.user) }
        record.presences = Set(present).sorted { ($0.user, $0.phone) < ($1.user, $1.phone) }
        record.lockedUsers = lockedUsers.sorted()
        return record
    }

    /// The longest a phone that held a presence link gets to come back after a restart: it
    /// must notice the box went, find it again and attach (its search runs in 1 s steps).
    static let restartGrace: Duration = .seconds(10)

    /// A restarted daemon takes up what the one before it guarded: the sessions logind still
    /// lists for the same uid (`live`, by ID; nil where logind did not answer), bound to the
    /// same phones; a grace time for each phone that was present, as if its link had just been
    /// lost (back within it, it attaches; else its walk-away follows, on the sessions it
    /// opened); the locked users.
    mutating func resume(_ record: GuardRecord, live: [String: LoginSession], now: Duration) {
        var kept: [String] = []
        for s in record.sessions {
            guard let session = live[s.id], session.uid == s.uid, session.user == s.user, session.isLocal else { continue }
            let phone = s.phone.flatMap(unhex).flatMap { try? PublicKey($0) }
            registered.register(session, service: s.service, phone: phone)
            kept.append("\(logSafe(session.id)) (\(logSafe(session.user)), \(logSafe(session.place))\(phone.map { ", phone \($0.fingerprint)" } ?? ""))")
        }
        lockedUsers = Set(record.lockedUsers)
        var waiting: [String] = []
        for p in record.presences {
            guard let phone = unhex(p.phone).flatMap({ try? PublicKey($0) }), enrolledUsers(of: phone).contains(p.user) else { continue }
            guard config.policy != .none else { continue }
            graces[phone] = Grace(user: p.user, deadline: now + max(config.grace, Self.restartGrace),
                                  reason: "its presence link did not come back after the box restarted")
            waiting.append("phone \(phone.fingerprint) (\(logSafe(p.user)))")
        }
        let dropped = record.sessions.count - kept.count
        audit(.notice, .presence, "after a restart: \(kept.isEmpty ? "no session on record" : "guarding session(s) \(kept.joined(separator: ", "))")"
              + (dropped > 0 ? "; \(dropped) session(s) ended meanwhile" : "")
              + (waiting.isEmpty ? "" : "; waiting \(spokenDuration(max(config.grace, Self.restartGrace))) for \(waiting.joined(separator: ", ")) to come back, else walk-away"))
        wakeTimers()
    }
}
