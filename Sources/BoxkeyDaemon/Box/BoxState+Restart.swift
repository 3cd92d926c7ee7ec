import BoxkeyCore

/// What the box guards, kept across a restart of the daemon (`GuardRecord`, `GuardFile`).
extension BoxState {
    /// The guarded state now: sessions on record, phones present or in their grace time,
    /// users locked.
    var guardRecord: GuardRecord {
        var record = GuardRecord()
        record.sessions = registered.entries.values.map(GuardRecord.Session.init).sorted { $0.id < $1.id }
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
    /// lists for the same uid (`answers`, by ID: the session, nil when logind says it is gone,
    /// an error when logind did not answer — then it is kept as recorded, never dropped on an
    /// outage), bound to the same phones; a grace time for each phone that was present, as if
    /// its link had just been lost (back within it, it attaches; else its walk-away follows, on
    /// the sessions it opened) — whatever its enrolment looks like now (a fleet phone's is known
    /// only once the fleet cache is read; a revoked one cannot attach, and is walked away); the
    /// locked users.
    mutating func resume(_ record: GuardRecord, answers: [String: Result<LoginSession?, any Error>], now: Duration) {
        var kept: [String] = [], unanswered: [String] = [], ended = 0
        for s in record.sessions {
            let phone = s.phone.flatMap(unhex).flatMap { try? PublicKey($0) }
            let session: LoginSession
            switch answers[s.id] {
            case .success(let live?) where live.uid == s.uid && live.user == s.user && live.isLocal:
                session = live
            case .failure?, nil:
                session = s.recorded
                unanswered.append(logSafe(s.id))
            default:
                ended += 1
                continue
            }
            registered.register(session, service: s.service, phone: phone)
            kept.append("\(logSafe(session.id)) (\(logSafe(session.user)), \(logSafe(session.place))\(phone.map { ", phone \($0.fingerprint)" } ?? ""))")
        }
        lockedUsers = Set(record.lockedUsers)
        var waiting: [String] = []
        let grace = max(config.grace, Self.restartGrace)
        if config.policy != .none {
            for p in record.presences {
                guard let phone = unhex(p.phone).flatMap({ try? PublicKey($0) }) else { continue }
                graces[phone] = Grace(user: p.user, deadline: now + grace, reason: "its presence link did not come back after the box restarted")
                waiting.append("phone \(phone.fingerprint) (\(logSafe(p.user)))")
            }
        }
        var said = "after a restart: " + (kept.isEmpty ? "no session on record" : "guarding session(s) \(kept.joined(separator: ", "))")
        if ended > 0 { said += "; \(ended) session(s) ended meanwhile (logind no longer lists them)" }
        if !unanswered.isEmpty { said += "; logind did not answer for session(s) \(unanswered.joined(separator: ", ")): guarded as recorded" }
        if !waiting.isEmpty { said += "; waiting \(spokenDuration(grace)) for \(waiting.joined(separator: ", ")) to come back, else walk-away" }
        // Said at notice only when it guards or waits for something: a quiet start stays quiet.
        audit(kept.isEmpty && waiting.isEmpty && ended == 0 ? .info : .notice, .presence, said)
        wakeTimers()
    }
}
