import BoxkeyCore
import BoxkeyPAMWire
import BoxkeyRadio
import FoundationEssentials
import Logging

/// What the box must send or do on the radio. One task performs these in order, so the
/// fragments of two messages to one phone never interleave.
enum RadioAction: Sendable {
    case notify(CentralID, fragments: [[UInt8]])
    case disconnect(CentralID)
    case advertise(AdvertisingData)
    /// The Info characteristic's new value (a fleet box's certificate or revocation list changed).
    case setInfo([UInt8])
}

/// Work a decision starts but does not wait for (logind calls take their time, and the actor
/// must keep serving meanwhile). `RadioService` runs each job as a child task of its own, so
/// the work belongs to a service of the ServiceGroup and ends with it (`BoxWorker` does it).
enum BoxWork: Sendable {
    /// Lock, logout or attach, asked on a phone's link.
    case act(ActionResult.Action, link: CentralID)
    /// `[unlock] logind_unlock`: a push with no prompt open, verified and unlocked here.
    case unlockThroughLogind(CredentialPush, phone: PublicKey, link: CentralID)
    /// A phone is gone (its link lost past the grace, its signal weak, or it was revoked): the
    /// policy's lock or logout.
    case walkAway(BoxState.WalkAway, BoxState.WalkAwayPlan)
    /// After a walk-away lock: checks the sessions did lock, and ends those that did not.
    case settle(locked: [LoginSession], phone: PublicKey, endable: Set<String>)
}

/// One audit line, as a value: the decision says what happened, the actor writes it.
struct AuditRecord: Sendable {
    var level: Logger.Level
    var event: AuditEvent
    var message: String
    var phone: String?
    var user: String?
    var service: String?
    var file: String
    var function: String
    var line: UInt
}

/// What a decision of `BoxState` asks the world to do. `Box` performs them in order.
enum BoxEffect: Sendable {
    case radio(RadioAction)
    case work(BoxWork)
    /// The answer to an Enter that waits at prompt `prompt` (`Box.take`).
    case answer(prompt: UInt64, PromptAnswer)
    case audit(AuditRecord)
    case log(Logger.Level, String)
    /// A deadline may be sooner than the timer loop knows.
    case wakeTimers
    /// A presence link started: the presence service reads its RSSI.
    case presenceChanged
    /// `[fleet] publish`: write a phone enrolled here to the directory.
    case publish(PublicKey, user: String, name: String)
}

/// The box's state and its decisions, with no I/O of their own: each decision takes `now`,
/// changes the state, and leaves what must happen in `effects` (a notification, a hang-up, an
/// answer to a prompt, an audit line), which `Box` performs. The decisions are split by
/// subject: radio and pairing (`BoxState+Radio`), logins and offers (`BoxState+Login`),
/// prompts, presence and time (`BoxState+Prompts`), the password check's verdicts
/// (`BoxState+Verdicts`), lock, logout, attach and walk-away (`BoxState+Sessions`).
///
/// Still here and not yet effects: the phone registry's and the escrow store's file writes
/// (an enrolment is audited only once it is on disk), and the user database lookup `userID`
/// (and `SystemUsers.accountName`, for the fleet's exact names).
struct BoxState {
    private(set) var config: DaemonConfig
    let identity: BoxIdentity
    var registry: PhoneRegistry
    var escrow: EscrowStore
    /// A user's uid (the system's user database; tests give a table).
    let userID: @Sendable (String) -> UInt32?
    /// The date, for what the fleet directory dates (its roster's age); decisions otherwise
    /// take the monotonic `now` they are given. Tests give a fixed one.
    let wallClock: @Sendable () -> Date
    /// What the decisions ask for, in order, until the actor takes them.
    var effects: [BoxEffect] = []

    // Radio
    var nonces = AdvertisementNonces.random()
    var replayCache = HandshakeReplayCache()
    var links: [CentralID: PhoneLink] = [:]
    /// Links the box hung up on and forgot before their disconnection arrived (refused at
    /// connect, pushed out to make room, replaced by a new connection from the address): the
    /// channel each named, or names in a write that still arrives, is no other link's until
    /// then, or for `hungUpChannelMemory` at most.
    var hungUp: [CentralID: HungUpLink] = [:]
    struct HungUpLink {
        var channel: FrameChannel?
        var since: Duration
    }

    // Trust
    var enrolment: Enrolment
    var prompts = PromptTable()
    /// Prompts where Enter waits for a phone's push (the actor holds their continuations).
    var waiting: Set<UInt64> = []
    var registered = SessionRegistry() { didSet { guardVersion &+= 1 } }
    /// Users whose session the box locked: a phone must push again (unlock), not just attach.
    var lockedUsers: Set<String> = [] { didSet { guardVersion &+= 1 } }
    /// The fleet directory's phones as last read (nil: no `[fleet]`, or never read).
    var fleetRoster: FleetRoster?
    var fleetHealth = FleetHealth()
    /// This box's fleet certificate and the fleet's current revocation list, as Info serves
    /// them (empty: not a certified box).
    var fleetCredentials: [UInt8] = []

    // Presence
    var presences: [CentralID: PresenceMonitor] = [:] { didSet { guardVersion &+= 1 } }
    var graces: [PublicKey: Grace] = [:] { didSet { guardVersion &+= 1 } }
    /// Counts changes to what `guardRecord` is made of: `Box` builds and compares the record
    /// only when it moved, so the radio's events (most changes) cost nothing there.
    private(set) var guardVersion: UInt64 = 0

    // Limits
    /// Failed or stalled handshakes, and unknown keys, per radio address: a flooding address
    /// is cut off at connect, and enrolled phones' budgets are never touched by it.
    var failedHandshakes: RateLimiter<DeviceAddress>
    var rejectedByPhone: RateLimiter<PublicKey>
    /// Proximity offers per phone: an enrolled phone cannot hold prompts with its offer on them
    /// over and over (each may stand up to `max_wait_s`).
    var offersByPhone = RateLimiter<PublicKey>(limit: BoxState.offersPerPhone, window: .seconds(300))
    static let offersPerPhone = 3
    /// Pushes of a phone not enrolled for the user (a pending one) left waiting at her prompt
    /// with nobody pressing Enter, per phone: after these it is refused for a while.
    var heldUnusedByPhone = RateLimiter<PublicKey>(limit: BoxState.heldUnusedPerPhone, window: .seconds(300))
    static let heldUnusedPerPhone = 3
    var rejectedByUser: RateLimiter<String>
    /// When each phone's (or address's) refusal was last logged as a notice.
    var refusalsLogged: [String: Duration] = [:]
    static let refusalLogInterval: Duration = .seconds(600)
    /// Rejected pushes of all phones not (yet) enrolled for the user they pushed for, together.
    var rejectedNewPhones: RateLimiter<String>
    static let newPhones = "new phones"

    struct PhoneLink {
        var id: CentralID
        var mtu: Int
        var connectedAt: Duration
        /// Its address had too many failed handshakes in the last minute when it connected.
        var limited = false
        var reassembler = FrameReassembler()
        var connection: BoxConnection
        var subscribed = false
        /// The box has hung up: writes already queued behind the decision are discarded, not
        /// processed (a flood would otherwise be counted and logged once per queued write).
        var dropped = false
        var mtuLogged = false
        /// Answers ready before the phone's subscription was seen: a phone enables
        /// notifications and writes its first message together, and the two may be reported
        /// in either order. Sent when the subscription arrives; a link that never subscribes
        /// ends at its handshake or command timeout.
        var unsent: [[UInt8]] = []
        /// Hung up by the box while its last words (a refusal) wait in `unsent`: the
        /// disconnect follows the subscription, or the handshake timeout, whichever comes first.
        var hangUpWhenHeard = false
        /// Its first fragment named a channel another link already held: nothing is ever said
        /// to it (the other phone would hear it as its own). The link that held it first is
        /// unaffected; it was there before.
        var copiedAChannel = false
        /// The channel its writes named after the box hung up on it before learning its own
        /// (a handshake timeout): kept from other links until its disconnection arrives, since
        /// the phone is still there and would hear anything said on it.
        var channelHeardAfterHangUp: FrameChannel?
        /// The channel no other link may take while this one is connected.
        var channelTaken: FrameChannel? { reassembler.channel ?? channelHeardAfterHangUp }
        var prompt: UInt64?
        /// The code this link's pairing handshake was answered under.
        var pairingCode: Enrolment.LiveCode?
    }

    struct Grace {
        var user: String
        var deadline: Duration
        var reason: String
    }

    /// A presence link's phone that is gone (its grace ran out, its signal went weak): the
    /// policy's lock or logout follows (`queueWalkAway`, then `BoxWorker`).
    struct WalkAway: Sendable {
        var phone: PublicKey
        var user: String
        var reason: String
    }

    init(config: DaemonConfig, identity: BoxIdentity, registry: PhoneRegistry, escrow: EscrowStore,
         userID: @escaping @Sendable (String) -> UInt32?, wallClock: @escaping @Sendable () -> Date = { Date() }) {
        self.config = config
        self.wallClock = wallClock
        self.identity = identity
        self.registry = registry
        self.escrow = escrow
        self.userID = userID
        enrolment = Enrolment(lifetime: config.pairingCodeLifetime, tries: config.pairingCodeTries, pendingWindow: config.pendingEnrolment)
        failedHandshakes = RateLimiter(limit: config.failedHandshakesPerMinute, window: .seconds(60))
        rejectedByPhone = RateLimiter(limit: config.rejectedPushesPerPhone, window: config.rejectionWindow)
        rejectedByUser = RateLimiter(limit: config.rejectedPushesPerUser, window: config.rejectionWindow)
        rejectedNewPhones = RateLimiter(limit: config.rejectedPushesPerPhone, window: config.rejectionWindow)
    }

    // MARK: - Effects

    mutating func emit(_ effect: BoxEffect) { effects.append(effect) }

    mutating func audit(_ level: Logger.Level, _ event: AuditEvent, _ message: String,
                        phone: String? = nil, user: String? = nil, service: String? = nil,
                        file: String = #fileID, function: String = #function, line: UInt = #line) {
        effects.append(.audit(AuditRecord(level: level, event: event, message: message, phone: phone, user: user, service: service,
                                          file: file, function: function, line: line)))
    }

    mutating func log(_ level: Logger.Level, _ message: String) { effects.append(.log(level, message)) }

    mutating func wakeTimers() { effects.append(.wakeTimers) }

    mutating func readvertise() { effects.append(.radio(.advertise(advertisingData))) }

    // MARK: - Settings

    /// SIGHUP: takes the new settings that can change while running (limits, enrolment,
    /// presence, services, timeouts); returns the changed keys that need a restart. Counts and
    /// links in progress carry on under the new limits.
    mutating func reload(_ reloaded: DaemonConfig, now: Duration) -> (changed: [String], needRestart: [String]) {
        let (next, needRestart) = config.reloading(reloaded)
        let changed = config.changes(to: next)
        config = next
        enrolment.lifetime = next.pairingCodeLifetime
        enrolment.tries = next.pairingCodeTries
        enrolment.pendingWindow = next.pendingEnrolment
        failedHandshakes.limit = next.failedHandshakesPerMinute
        rejectedByPhone.limit = next.rejectedPushesPerPhone
        rejectedByPhone.window = next.rejectionWindow
        rejectedByUser.limit = next.rejectedPushesPerUser
        rejectedByUser.window = next.rejectionWindow
        rejectedNewPhones.limit = next.rejectedPushesPerPhone
        rejectedNewPhones.window = next.rejectionWindow
        // Proximity turned off: an offer on a screen is withdrawn (Enter there brings the
        // password prompt), unless the person already asked.
        if !next.proximity {
            for prompt in prompts.prompts.values where prompt.offer.map({ !$0.intent }) ?? false {
                withdrawOffer(of: prompt.id, "proximity login was turned off at box \(identity.boxID)", now: now)
            }
        }
        // A prompt open in a service no longer listed takes no push any more (Enter there brings
        // the password prompt back); a held push whose wait is longer than the new one is cut to it.
        for prompt in prompts.prompts.values where !prompt.delivered {
            if !next.phoneLoginServices.contains(prompt.request.service) {
                closePrompt(prompt.id, .superseded, now: now)
            } else if prompt.held != nil, let deadline = prompt.deadline, deadline > now + next.enterWait {
                prompts[prompt.id]?.deadline = now + next.enterWait
            }
        }
        wakeTimers()
        return (changed, needRestart)
    }

    // MARK: - Advertisement and GATT

    var gattService: GATTService {
        GATTService(uuid: BoxkeyProtocol.serviceUUID, characteristics: [
            GATTCharacteristic(uuid: BoxkeyProtocol.infoCharacteristicUUID, properties: .read,
                               value: info.encode()),
            GATTCharacteristic(uuid: BoxkeyProtocol.requestCharacteristicUUID, properties: [.write, .writeWithoutResponse]),
            GATTCharacteristic(uuid: BoxkeyProtocol.responseCharacteristicUUID, properties: .notify),
        ])
    }

    /// A prompt whose held push is from a phone not enrolled for the prompt's user.
    func heldByStranger(_ prompt: PromptTable.Prompt) -> Bool {
        guard prompt.held != nil, let v = prompt.verifying, !prompt.request.expectedUser.isEmpty else { return false }
        return !enrolledUsers(of: v.phone).contains(prompt.request.expectedUser)
    }

    /// What a phone reads before pairing, or before trusting a fleet box: ID, key, and for a
    /// fleet box its certificate and the fleet's revocation list.
    var info: BoxInfo { BoxInfo(boxID: identity.boxID, staticKey: identity.keyPair.publicKey, fleet: fleetCredentials) }

    var advertisingData: AdvertisingData {
        var flags: Advertisement.Flags = []
        // A prompt held only by a phone not enrolled for its user still waits, as far as that
        // user's phones can tell: their offer or push takes it back (`takeBackHeldPrompt`).
        if !prompts.takingPushes.isEmpty || prompts.prompts.values.contains(where: heldByStranger) { flags.insert(.loginPromptWaiting) }
        if !presences.isEmpty { flags.insert(.sessionActive) }
        let advert = Advertisement(flags: flags, boxID: identity.boxID, nonce: nonces.current,
                                   keyHint: identity.keyPair.publicKey.advertisementHint)
        return AdvertisingData(serviceUUIDs: [BoxkeyProtocol.serviceUUID],
                               manufacturerData: [BoxkeyProtocol.companyID: advert.encode()],
                               interval: config.advertisingInterval)
    }

    /// New nonce: handshakes must name this one or the previous one.
    mutating func rotateNonce() {
        nonces.rotate()
        replayCache.retain(nonces: nonces.live)
        readvertise()
    }

    // MARK: - Users

    func uid(of user: String) -> UInt32? { userID(user) }

    /// Whether a phone may be enrolled for `user`: not for root unless `[enrolment] root` says so.
    func mayEnrol(_ user: String) -> Bool { config.enrolRoot || uid(of: user) != 0 }
}
