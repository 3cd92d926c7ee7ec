import BoxkeyCore

/// The logind sessions the box may act on, each checked with logind to be local and to belong
/// to the user who opened it, keyed by session ID (a user may have several; closing one forgets
/// only that one), and bound to the phone whose push opened or unlocked it.
public struct SessionRegistry: Sendable {
    public struct Entry: Sendable, Equatable {
        public var session: LoginSession
        public var service: String
        public var phone: PublicKey?
    }

    /// A push that was accepted: its session, if any opens, is bound to the phone.
    struct Ticket: Sendable {
        var phone: PublicKey
        var user: String
        var expires: Duration
    }

    public private(set) var entries: [String: Entry] = [:]
    private var tickets: [String: Ticket] = [:]
    /// How long an accepted push's ticket waits for `pam_sm_open_session`.
    static let ticketLifetime: Duration = .seconds(120)

    public init() {}

    public mutating func issueTicket(phone: PublicKey, user: String, now: Duration) -> String {
        let ticket = hex(SystemRandom.bytes(16))
        tickets = tickets.filter { $0.value.expires > now }
        tickets[ticket] = Ticket(phone: phone, user: user, expires: now + Self.ticketLifetime)
        return ticket
    }

    /// The phone an unexpired ticket names, if it was issued for `user`; a ticket works once.
    public mutating func redeem(_ ticket: String, user: String, now: Duration) -> PublicKey? {
        guard !ticket.isEmpty, let t = tickets.removeValue(forKey: ticket), t.expires > now, t.user == user else { return nil }
        return t.phone
    }

    public mutating func register(_ session: LoginSession, service: String, phone: PublicKey?) {
        entries[session.id] = Entry(session: session, service: service, phone: phone ?? entries[session.id]?.phone)
    }

    public mutating func close(_ sessionID: String) { entries[sessionID] = nil }

    public func sessions(boundTo phone: PublicKey) -> [LoginSession] {
        entries.values.filter { $0.phone == phone }.map(\.session).sorted { $0.id < $1.id }
    }

    public func sessions(of user: String) -> [LoginSession] {
        entries.values.filter { $0.session.user == user }.map(\.session).sorted { $0.id < $1.id }
    }
}
