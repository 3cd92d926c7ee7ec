import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio

/// The login prompts open for phone login, and which of them a push may go to. Pure: no
/// timers, no continuations (the box keeps those).
///
/// A prompt is open from the module's `waitForPush` until its connection ends: the module asks
/// the person for the password at once, and a push for the prompt waits here (`held`) until
/// the person presses Enter there (`intent`), which delivers it.
public struct PromptTable: Sendable {
    public struct Prompt: Sendable {
        public var id: UInt64
        public var request: PAMRequest.WaitRequest
        /// The logind session of the process that asked, when it has one (a screen locker).
        public var owner: LoginSession?
        /// The process that asked (SO_PEERCRED), for the log.
        public var pid: Int32 = 0
        /// When the current step ends: a held push, an offer, an Enter waiting for a phone, a
        /// delivered push's verdict. nil: open, nothing to wait for.
        public var deadline: Duration?
        /// Open and free: no push held or delivered. Only such a prompt takes a push (or an
        /// offer), and only one that names its user (`expectedUser`).
        public var waiting = true
        /// Set once a push went to this prompt: whose it was, for the outcome relay.
        public var verifying: Verifying?
        /// The push (key login, escrow capture) waiting for Enter at this prompt.
        public var held: PromptAnswer?
        /// The module has the push: the stack is verifying it.
        public var delivered = false
        /// Enter was pressed with an offer here: the module waits for that phone's push (the
        /// box holds its continuation).
        public var entered = false
        /// A proximity offer shown at this prompt: only that phone may push here, for that
        /// user, and only after the person asked (`intent`).
        public var offer: Offer?
        /// The pairing code the prompt last showed (empty: none).
        public var shownCode = ""

        /// "lightdm on seat0 :0", "login on tty2": what the phone prints.
        public var description: String {
            // shadow's login gives PAM_TTY as a path ("/dev/tty1"); LightDM gives the display as both.
            let tty = request.tty.hasPrefix("/dev/") ? String(request.tty.dropFirst(5)) : request.tty
            let place = owner?.place ?? (tty == request.display ? [tty] : [tty, request.display]).filter { !$0.isEmpty }.joined(separator: " ")
            return place.isEmpty ? request.service : "\(request.service) on \(place)"
        }
    }

    public struct Verifying: Sendable {
        public var link: CentralID
        public var phone: PublicKey
        /// A pending phone's push, kept (in secure memory) until the box has confirmed it
        /// through its own password-only PAM service: the stack's success alone does not say
        /// the pushed password was what it checked (a fingerprint or U2F module may follow).
        public var pendingPassword: SecureBytes?
        /// Escrow mode: what this push does with the sealed copy.
        public var escrow: Escrow?
        /// The password the person typed at a capture prompt, once the module sends it.
        public var captured: SecureBytes?
        public var user: String
        public var name: String
        public var ticket: String
    }

    public struct Offer: Sendable {
        public var link: CentralID
        public var phone: PublicKey
        public var user: String
        public var intent = false
    }

    public enum Escrow: Sendable {
        /// The sealed copy opened and its password went to the stack. Destroyed only if the
        /// box's own service then refuses that password (it changed): a stack's "no" may be a
        /// locked account, a directory outage or a cancelled prompt.
        case opened(password: SecureBytes)
        /// No copy yet: the person types the password at this prompt, and once the stack and
        /// the box's own check accept it, it is sealed under this secret from the phone.
        case capture(secret: SecureBytes)
    }

    public enum Choice: Equatable, Sendable {
        case prompt(UInt64)
        case none
        /// Prompts are waiting, but none may log in this user.
        case otherUser
        /// Only prompts that name no user yet are waiting (a greeter's "other user" before the
        /// name is typed): Enter there would log in whoever's push happened to wait.
        case namesNobody
        /// More than one prompt could take it: the box does not guess.
        case ambiguous([String])
    }

    public private(set) var prompts: [UInt64: Prompt] = [:]
    private var nextID: UInt64 = 0

    public init() {}

    public mutating func add(_ request: PAMRequest.WaitRequest, owner: LoginSession?, pid: Int32 = 0) -> (id: UInt64, superseded: [UInt64]) {
        // A new prompt on the same terminal replaces the old one (the greeter restarted).
        let superseded = prompts.values.filter { !$0.delivered && $0.request.service == request.service && $0.request.tty == request.tty
                                                 && $0.request.display == request.display }.map(\.id)
        nextID += 1
        prompts[nextID] = Prompt(id: nextID, request: request, owner: owner, pid: pid)
        return (nextID, superseded)
    }

    public subscript(id: UInt64) -> Prompt? {
        get { prompts[id] }
        set { prompts[id] = newValue }
    }

    /// The open prompts free for a push.
    public var waiting: [Prompt] { prompts.values.filter(\.waiting).sorted { $0.id < $1.id } }

    /// The open prompts that could take a push: free, and for a named user.
    public var takingPushes: [Prompt] { waiting.filter { !$0.request.expectedUser.isEmpty } }

    /// Which prompt a push for `user` goes to: the only open, free prompt for that user — a
    /// console login where the name was typed, a greeter with the user chosen, that user's
    /// locker. A prompt that names nobody takes no push: the person pressing Enter there would
    /// be logged in as whoever's push waited.
    public func choose(for user: String) -> Choice {
        let open = waiting
        guard !open.isEmpty else { return .none }
        let fit = open.filter { $0.request.expectedUser == user }
        switch fit.count {
        case 0: return open.allSatisfy(\.request.expectedUser.isEmpty) ? .namesNobody : .otherUser
        case 1: return .prompt(fit[0].id)
        default: return .ambiguous(fit.map(\.description))
        }
    }

    public mutating func remove(_ id: UInt64) { prompts[id] = nil }
}
