import BoxkeyCore

/// The box's pairing code and the phones that proved it, as a pure value (time is passed in).
///
/// One code is live at a time: shown by every waiting phone-login prompt and by
/// `boxkeyd pair-code`. It lasts `lifetime`, allows `tries` pairing handshakes (each one tests
/// a single guess, see `CPace`) and is used up by the first phone that proves it. That phone
/// is then *pending*: its first accepted login within `pendingWindow` enrols it for that
/// login's user (or only for `user`, when the code was shown for one user). An admin code with
/// a user enrols the phone for that user at once.
public struct Enrolment: Sendable {
    public struct LiveCode: Sendable, Equatable {
        public var code: PairingCode
        /// Only this user may be enrolled under the code (a screen locker's user, or the
        /// admin's `--user`); nil for a greeter's code.
        public var user: String?
        /// An admin's code with a user enrols at pairing, without waiting for a login.
        public var enrolsAtPairing: Bool
        /// Minted by `boxkeyd pair-code`: never shown at a prompt.
        public var byAdmin = false
        public var expires: Duration
        public var triesLeft: Int
    }

    public struct Pending: Sendable, Equatable {
        public var user: String?
        public var until: Duration
    }

    public var lifetime: Duration
    public var tries: Int
    public var pendingWindow: Duration
    public private(set) var live: LiveCode?
    /// The code whose last try is a handshake under way, for as long as a handshake may take.
    private var lastTry: LiveCode?
    static let handshakeTime: Duration = .seconds(30)
    private var pending: [PublicKey: Pending] = [:]

    public init(lifetime: Duration = .seconds(120), tries: Int = 3, pendingWindow: Duration = .seconds(300)) {
        self.lifetime = lifetime
        self.tries = tries
        self.pendingWindow = pendingWindow
    }

    /// The live code a new pairing handshake may use: not expired, a try left.
    public mutating func current(now: Duration) -> LiveCode? {
        if let l = live, l.expires <= now { live = nil }
        return live
    }

    /// Whether a pairing handshake begun under `code` may still complete. A try is charged when
    /// a handshake begins (each tests one guess), so the code that took its last try waits in
    /// `lastTry` for that handshake: the right code on the last try still pairs.
    public mutating func confirmable(_ code: PairingCode, now: Duration) -> Bool {
        if let l = lastTry, l.expires <= now { lastTry = nil }
        return current(now: now)?.code == code || lastTry?.code == code
    }

    /// The code a new prompt shows: the live one, or a fresh one for `user`. An admin's code
    /// (`boxkeyd pair-code`) is for the admin's eyes: prompts show none while it is live.
    public mutating func codeForPrompt(user: String?, now: Duration) -> LiveCode? {
        if let l = current(now: now) { return l.byAdmin ? nil : l }
        return mint(user: user, enrolsAtPairing: false, now: now)
    }

    /// A fresh code, replacing any live one (an admin asked, or a prompt needed one).
    @discardableResult
    public mutating func mint(user: String?, enrolsAtPairing: Bool, byAdmin: Bool = false, now: Duration) -> LiveCode {
        let l = LiveCode(code: .random(), user: user, enrolsAtPairing: enrolsAtPairing && user != nil,
                         byAdmin: byAdmin, expires: now + lifetime, triesLeft: tries)
        live = l
        return l
    }

    /// A pairing handshake was answered under the live code: one try is used.
    public mutating func attempted(now: Duration) {
        guard current(now: now) != nil else { return }
        live!.triesLeft -= 1
        if live!.triesLeft <= 0 {
            lastTry = live
            lastTry!.expires = min(live!.expires, now + Self.handshakeTime)
            live = nil
        }
    }

    /// A phone proved the code (its `pair` message decrypted): the code is used up. Returns
    /// the user to enrol at once, or nil when the phone is now pending.
    public mutating func paired(_ phone: PublicKey, code: LiveCode, now: Duration) -> String? {
        if live?.code == code.code { live = nil }
        if lastTry?.code == code.code { lastTry = nil }
        if code.enrolsAtPairing, let user = code.user { return user }
        pending[phone] = Pending(user: code.user, until: now + pendingWindow)
        return nil
    }

    public mutating func pendingEnrolment(of phone: PublicKey, now: Duration) -> Pending? {
        if let p = pending[phone], p.until <= now { pending[phone] = nil }
        return pending[phone]
    }

    /// The pending phone logged in (or was revoked): it is pending no more.
    public mutating func settle(_ phone: PublicKey) { pending[phone] = nil }

    public var pendingCount: Int { pending.count }
}
