import BoxkeyCore
@testable import BoxkeyDaemon
import BoxkeyPAMWire
import BoxkeyRadio
import BoxkeyTestWorlds
import Foundation
import NIOConcurrencyHelpers
import Testing

/// `BoxState` on its own: events in, effects out, time given as `now`. No actor, no radio, no
/// clock and no sleep; the phone is the real protocol value (`PhoneConnection`), its fragments
/// written straight into the state and the state's notifications read straight back.
struct BoxStateTests {
    static let alicesPrompt = PAMRequest.WaitRequest(service: "login", tty: "tty1", display: "", expectedUser: "alice", timeoutMilliseconds: 0)

    /// A box whose registry enrols `phone` for `user`.
    static func box(enrolling phone: KeyPair, for user: String, configure: (inout DaemonConfig) -> Void = { _ in },
                    wallClock: @escaping @Sendable () -> Date = { Date() }) throws -> BoxState {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-state-\(UUID().uuidString.prefix(8))").path
        var config = DaemonConfig()
        config.stateDirectory = directory
        configure(&config)
        let identity = try BoxIdentity.loadOrCreate(directory: directory, configuredID: BoxID(4821)!)
        var registry = try PhoneRegistry.load(directory: directory)
        try registry.enrol(phone.publicKey, user: user, name: "test phone", by: "test")
        return BoxState(config: config, identity: identity, registry: registry,
                        escrow: EscrowStore(path: directory + "/escrow.json"), userID: testUsers, wallClock: wallClock)
    }

    /// A box with a phone enrolled for `user`, alice's prompt open at `now` and the phone's
    /// channel open.
    static func atAlicesPrompt(phoneFor user: String = "alice", now: Duration,
                               configure: (inout DaemonConfig) -> Void = { _ in }) throws -> (box: BoxState, prompt: UInt64, phone: Phone) {
        let key = KeyPair.generate()
        var box = try box(enrolling: key, for: user, configure: configure)
        let (prompt, _) = box.openPrompt(alicesPrompt, owner: nil, pid: 42, now: now)
        var phone = try Phone(key, at: box)
        try phone.open(&box, now: now)
        return (box, prompt, phone)
    }

    /// One phone's link to the state: what it writes goes in as radio events, what the state
    /// notifies comes back whole.
    struct Phone {
        let id: CentralID
        let mtu = 247
        var channel = FrameChannel.random()
        var connection: PhoneConnection
        var inbox = FrameReassembler()

        init(_ key: KeyPair, at box: BoxState, link n: UInt8 = 1) throws {
            id = CentralID(address: DeviceAddress(String(format: "AA:BB:CC:00:00:%02X", n))!, connection: UInt64(n))
            let advert = try Advertisement.decode(box.advertisingData.manufacturerData[BoxkeyProtocol.companyID]!)
            connection = PhoneConnection(identity: key, boxKey: box.identity.keyPair.publicKey, advertisement: advert)
        }

        func write(_ envelope: [UInt8], to box: inout BoxState, now: Duration) throws {
            for fragment in try Framing.fragment(envelope, mtu: mtu, channel: channel) {
                box.handle(.wrote(id, characteristic: BoxkeyProtocol.requestCharacteristicUUID, value: fragment, mtu: mtu), now: now)
            }
        }

        /// The events the state's notifications to this phone carry, in order.
        mutating func read(_ box: inout BoxState, now: Duration) throws -> [PhoneConnection.Event] {
            var events: [PhoneConnection.Event] = []
            for case .radio(.notify(let to, let fragments)) in box.take() where to == id {
                for fragment in fragments {
                    if let message = try inbox.receive(fragment, mtu: mtu, now: now) { events.append(try connection.receive(message)) }
                }
            }
            return events
        }

        /// Connects and subscribes to the box's responses.
        func connect(to box: inout BoxState, now: Duration) {
            box.handle(.connected(id, mtu: mtu), now: now)
            box.handle(.subscribed(id, characteristic: BoxkeyProtocol.responseCharacteristicUUID), now: now)
        }

        /// Connects, subscribes and handshakes.
        mutating func open(_ box: inout BoxState, now: Duration) throws {
            connect(to: &box, now: now)
            try write(try connection.start(), to: &box, now: now)
            #expect(try read(&box, now: now) == [.channelOpen])
        }

        mutating func push(_ user: String, _ password: String, to box: inout BoxState, now: Duration) throws -> [PhoneConnection.Event] {
            let push = CredentialPush(user: user, password: SecureBytes(copying: Array(password.utf8)), deviceName: "test phone")
            try write(try connection.send(.credentialPush(push)), to: &box, now: now)
            return try read(&box, now: now)
        }
    }

    /// What the state told the radio to do to `id`, in order: "notify <envelope kinds>" or "hang up".
    static func radio(to id: CentralID, in effects: [BoxEffect]) throws -> [String] {
        var said: [String] = []
        for effect in effects {
            switch effect {
            case .radio(.notify(let to, let fragments)) where to == id:
                var r = FrameReassembler()
                for f in fragments {
                    if let m = try r.receive(f, mtu: 247, now: .zero) {
                        said.append("notify " + String(describing: try Envelope.decode(m)).prefix { $0 != "(" })
                    }
                }
            case .radio(.disconnect(let d)) where d == id: said.append("hang up")
            default: break
            }
        }
        return said
    }

    /// A full box makes room by hanging up the oldest link without a handshake: hung up, not
    /// only forgotten, or it would stay connected and hold a slot of the controller's.
    @Test func aLinkPushedOutToMakeRoomIsHungUp() throws {
        var box = try Self.box(enrolling: KeyPair.generate(), for: "alice")
        let now = Duration.seconds(100)
        let ids = try (1...(DaemonConfig().maxConnections + 1)).map { try Phone(KeyPair.generate(), at: box, link: UInt8($0)).id }
        for (i, id) in ids.enumerated() { box.handle(.connected(id, mtu: 247), now: now + .milliseconds(i)) }
        #expect(try Self.radio(to: ids[0], in: box.take()) == ["hang up"])
    }

    /// A phone's first message may arrive before its subscription. A refusal then waits for the
    /// subscription, and the hang-up follows it; a link that never subscribes is hung up at
    /// the handshake timeout, or sooner when the box is full.
    @Test func aRefusalWaitsForTheSubscriptionAndTheHangUpFollowsIt() throws {
        var box = try Self.box(enrolling: KeyPair.generate(), for: "alice")
        let now = Duration.seconds(100)
        var strangers = try (1...3).map { try Phone(KeyPair.generate(), at: box, link: UInt8($0)) }   // enrolled nowhere
        for i in strangers.indices {
            box.handle(.connected(strangers[i].id, mtu: 247), now: now)
            try strangers[i].write(try strangers[i].connection.start(), to: &box, now: now)
        }
        var effects = box.take()
        for s in strangers { #expect(try Self.radio(to: s.id, in: effects) == []) }
        box.handle(.subscribed(strangers[0].id, characteristic: BoxkeyProtocol.responseCharacteristicUUID), now: now + .milliseconds(30))
        #expect(try Self.radio(to: strangers[0].id, in: box.take()) == ["notify refusal", "hang up"])
        // The second never subscribes: hung up at the handshake timeout.
        _ = box.tick(now: now + box.config.handshakeTimeout - .milliseconds(1))
        #expect(try Self.radio(to: strangers[1].id, in: box.take()) == [])
        #expect(box.nextDeadline == now + box.config.handshakeTimeout)
        _ = box.tick(now: now + box.config.handshakeTimeout)
        effects = box.take()
        #expect(try Self.radio(to: strangers[1].id, in: effects) == ["hang up"])
        #expect(try Self.radio(to: strangers[2].id, in: effects) == ["hang up"])
        // A full box hangs up a link waiting to hear its refusal before anyone else.
        var late = try Phone(KeyPair.generate(), at: box, link: 9)
        box.handle(.connected(late.id, mtu: 247), now: now + .seconds(10))
        try late.write(try late.connection.start(), to: &box, now: now + .seconds(10))
        _ = box.take()
        for n in 10..<(10 + box.config.maxConnections) {
            box.handle(.connected(try Phone(KeyPair.generate(), at: box, link: UInt8(n)).id, mtu: 247), now: now + .seconds(11))
        }
        effects = box.take()
        #expect(try Self.radio(to: late.id, in: effects) == ["hang up"])
    }

    /// A link that copies another's channel is hung up without a word, and costs the link
    /// that held the channel first nothing: its answer, held for its subscription, still goes
    /// out while the copycat's disconnection has not yet arrived.
    @Test func aCopiedChannelCostsItsOwnerNothing() throws {
        let key = KeyPair.generate()
        var box = try Self.box(enrolling: key, for: "alice")
        let now = Duration.seconds(100)
        var owner = try Phone(key, at: box, link: 1)
        var copycat = try Phone(KeyPair.generate(), at: box, link: 2)
        copycat.channel = owner.channel
        box.handle(.connected(owner.id, mtu: 247), now: now)
        try owner.write(try owner.connection.start(), to: &box, now: now)
        copycat.connect(to: &box, now: now)
        try copycat.write(try copycat.connection.start(), to: &box, now: now + .milliseconds(5))
        let effects = box.take()
        #expect(try Self.radio(to: copycat.id, in: effects) == ["hang up"])
        #expect(try Self.radio(to: owner.id, in: effects) == [])
        box.handle(.subscribed(owner.id, characteristic: BoxkeyProtocol.responseCharacteristicUUID), now: now + .milliseconds(10))
        #expect(try owner.read(&box, now: now + .milliseconds(10)) == [.channelOpen])
    }

    /// Whether any notification among `effects` is on `channel`.
    static func saysAnything(on channel: FrameChannel, in effects: [BoxEffect]) -> Bool {
        effects.contains { effect in
            if case .radio(.notify(_, let fragments)) = effect { fragments.contains { $0.starts(with: channel.bytes) } } else { false }
        }
    }

    /// A link the box hung up on before it learned the link's channel (its handshake timed out)
    /// is still connected until its disconnection arrives, and its phone hears everything: the
    /// channel its late writes name is no other link's meanwhile.
    @Test func aLinkHungUpBeforeItsFirstWriteStillOwnsItsChannel() throws {
        let key = KeyPair.generate()
        var box = try Self.box(enrolling: key, for: "alice")
        let now = Duration.seconds(100)
        var slow = try Phone(key, at: box, link: 1)
        box.handle(.connected(slow.id, mtu: 247), now: now)
        _ = box.tick(now: now + box.config.handshakeTimeout)
        #expect(try Self.radio(to: slow.id, in: box.take()) == ["hang up"])
        let later = now + box.config.handshakeTimeout + .milliseconds(10)
        box.handle(.subscribed(slow.id, characteristic: BoxkeyProtocol.responseCharacteristicUUID), now: later)
        try slow.write(try slow.connection.start(), to: &box, now: later)
        var copycat = try Phone(KeyPair.generate(), at: box, link: 2)
        copycat.channel = slow.channel
        copycat.connect(to: &box, now: later)
        try copycat.write(try copycat.connection.start(), to: &box, now: later)
        let effects = box.take()
        #expect(try Self.radio(to: copycat.id, in: effects) == ["hang up"])
        #expect(!Self.saysAnything(on: slow.channel, in: effects))
    }

    /// The same for a link pushed out to make room, which the box forgets at once: until its
    /// disconnection arrives, the channel it named (or names in a late write) is no other
    /// link's. Once it has gone, the channel is free again.
    @Test func aLinkPushedOutKeepsItsChannelUntilItHasGone() throws {
        let key = KeyPair.generate()
        var box = try Self.box(enrolling: key, for: "alice")
        let now = Duration.seconds(100)
        var pushedOut = try Phone(key, at: box, link: 1)
        pushedOut.connect(to: &box, now: now)
        var others: [Phone] = []
        for n in 0..<box.config.maxConnections {
            others.append(try Phone(KeyPair.generate(), at: box, link: UInt8(10 + n)))
            others[n].connect(to: &box, now: now + .milliseconds(1))
        }
        #expect(try Self.radio(to: pushedOut.id, in: box.take()) == ["hang up"])
        try pushedOut.write(try pushedOut.connection.start(), to: &box, now: now + .milliseconds(2))
        others[0].channel = pushedOut.channel
        try others[0].write(try others[0].connection.start(), to: &box, now: now + .milliseconds(3))
        let effects = box.take()
        #expect(try Self.radio(to: others[0].id, in: effects) == ["hang up"])
        #expect(!Self.saysAnything(on: pushedOut.channel, in: effects))
        // Gone: a new connection may draw that channel (two phones' draws meet one time in 2^32).
        box.handle(.disconnected(pushedOut.id, reason: .localHost), now: now + .milliseconds(4))
        box.handle(.disconnected(others[0].id, reason: .localHost), now: now + .milliseconds(4))
        var next = try Phone(key, at: box, link: 40)
        next.channel = pushedOut.channel
        try next.open(&box, now: now + .milliseconds(5))
    }

    /// An enrolled phone's message 1 refused for want of a slot is remembered like an
    /// answered one: replayed on another link once a slot frees, it meets the replay cache
    /// instead of taking the slot.
    /// The same for a phone paired by code whose enrolment waits for its first login: its key
    /// is no more to be made up than an enrolled one.
    @Test(arguments: [false, true]) func aRefusedMessageOneReplayedLaterIsStillAReplay(pending: Bool) throws {
        let key = KeyPair.generate()
        var box = try Self.box(enrolling: pending ? KeyPair.generate() : key, for: "alice")
        let now = Duration.seconds(100)
        if pending {
            _ = box.enrolment.paired(key.publicKey, code: box.enrolment.mint(user: "alice", enrolsAtPairing: false, now: now), now: now)
        }
        var holding = [try Phone(key, at: box, link: 1), try Phone(key, at: box, link: 2)]
        for i in holding.indices { try holding[i].open(&box, now: now) }
        var third = try Phone(key, at: box, link: 3)
        third.connect(to: &box, now: now)
        let recorded = try third.connection.start()
        try third.write(recorded, to: &box, now: now)
        #expect(try Self.refusals(to: third.id, in: box.take()) == [.busy])
        box.handle(.disconnected(holding[0].id, reason: .remoteUser), now: now + .seconds(1))
        box.handle(.disconnected(third.id, reason: .localHost), now: now + .seconds(1))
        let replayer = try Phone(KeyPair.generate(), at: box, link: 4)
        replayer.connect(to: &box, now: now + .seconds(2))
        try replayer.write(recorded, to: &box, now: now + .seconds(2))
        #expect(try Self.refusals(to: replayer.id, in: box.take()) == [.replayedHandshake])
    }

    /// An enrolled insider holding its two slots has every further handshake refused `busy`,
    /// and each one cached all the same: the cheapest flood of the replay cache. At the cache's
    /// bound the insider forgets its own; alice's recorded message 1 stays a replay, and alice
    /// still gets in (before, a full cache refused her `rateLimited`).
    @Test func anInsidersRefusedFloodAgesOutOnlyItsOwnHandshakes() throws {
        let alice = KeyPair.generate(), mallory = KeyPair.generate()
        var box = try Self.box(enrolling: alice, for: "alice")
        try box.registry.enrol(mallory.publicKey, user: "mallory", name: "mallory's phone", by: "test")
        box.replayCache = HandshakeReplayCache(capacity: 8)
        let now = Duration.seconds(100)
        var first = try Phone(alice, at: box, link: 1)
        first.connect(to: &box, now: now)
        let recorded = try first.connection.start()
        try first.write(recorded, to: &box, now: now)
        #expect(try first.read(&box, now: now) == [.channelOpen])
        box.handle(.disconnected(first.id, reason: .remoteUser), now: now)
        var holding = [try Phone(mallory, at: box, link: 2), try Phone(mallory, at: box, link: 3)]
        for i in holding.indices { try holding[i].open(&box, now: now) }
        for n: UInt8 in 10..<30 {
            var flood = try Phone(mallory, at: box, link: n)
            flood.connect(to: &box, now: now)
            try flood.write(try flood.connection.start(), to: &box, now: now)
            #expect(try Self.refusals(to: flood.id, in: box.take()) == [.busy])
            box.handle(.disconnected(flood.id, reason: .localHost), now: now)
        }
        #expect(box.replayCache.count == 8)
        let replayer = try Phone(KeyPair.generate(), at: box, link: 99)
        replayer.connect(to: &box, now: now)
        try replayer.write(recorded, to: &box, now: now)
        #expect(try Self.refusals(to: replayer.id, in: box.take()) == [.replayedHandshake])
        var again = try Phone(alice, at: box, link: 100)
        try again.open(&box, now: now)
    }

    /// The refusal codes among the notifications to `id`.
    static func refusals(to id: CentralID, in effects: [BoxEffect]) throws -> [Refusal.Code] {
        var codes: [Refusal.Code] = []
        for case .radio(.notify(let to, let fragments)) in effects where to == id {
            var r = FrameReassembler()
            for f in fragments {
                if let m = try r.receive(f, mtu: 247, now: .zero), case .refusal(let refusal) = try Envelope.decode(m) { codes.append(refusal.code) }
            }
        }
        return codes
    }

    /// A flood of connections pushed out one after another (each remembered until its
    /// disconnection) does not push out the memory of an honest link's channel: those that
    /// name none are forgotten first.
    @Test func aFloodOfConnectionsDoesNotFreeAHungUpLinksChannel() throws {
        let key = KeyPair.generate()
        var box = try Self.box(enrolling: key, for: "alice", configure: { $0.maxConnections = 1 })
        let now = Duration.seconds(100)
        var honest = try Phone(key, at: box, link: 1)
        honest.connect(to: &box, now: now)
        for n in 0...BoxState.hungUpLinksKept + 8 {
            let id = CentralID(address: DeviceAddress(String(format: "AA:BB:CD:00:%02X:%02X", n >> 8, n & 0xff))!, connection: UInt64(1000 + n))
            box.handle(.connected(id, mtu: 247), now: now + .microseconds(n))
            if n == 0 { try honest.write(try honest.connection.start(), to: &box, now: now + .microseconds(n)) }
        }
        _ = box.take()
        var copycat = try Phone(KeyPair.generate(), at: box, link: 2)
        copycat.channel = honest.channel
        copycat.connect(to: &box, now: now + .milliseconds(2))
        try copycat.write(try copycat.connection.start(), to: &box, now: now + .milliseconds(2))
        let effects = box.take()
        #expect(try Self.radio(to: copycat.id, in: effects) == ["hang up"])
        #expect(!Self.saysAnything(on: honest.channel, in: effects))
        #expect(box.hungUp.count <= BoxState.hungUpLinksKept)
    }

    /// The directory's users count only while its last read is fresh by the box's own wall
    /// clock, which the state is given (no `Date()` inside a decision).
    @Test func aFleetRosterVouchesOnlyWhileFreshByTheBoxsClock() throws {
        let read = Date(timeIntervalSince1970: 1_800_000_000)
        let today = NIOLockedValueBox(read)
        let phone = KeyPair.generate()
        var box = try Self.box(enrolling: KeyPair.generate(), for: "alice",
                               configure: { $0.fleet = .init(uri: "ldaps://directory.example", base: "dc=example") },
                               wallClock: { today.withLockedValue { $0 } })
        var roster = FleetRoster(readAt: read)
        roster.add(user: "bob", values: [FleetRoster.value(key: phone.publicKey, name: "")])
        box.fleetCacheLoaded(roster)
        #expect(box.enrolledUsers(of: phone.publicKey) == ["bob"])
        #expect(box.fleetStatus()?.fresh == true)
        today.withLockedValue { $0 = read + 3601 }
        #expect(box.enrolledUsers(of: phone.publicKey).isEmpty)
        #expect(box.fleetStatus()?.fresh == false)
        #expect(box.fleetStatus()?.lastReadAgeSeconds == 3601)
        // The clock set back by hours (an NTP step after an RTC-less boot, `date -s`): the last
        // read now looks as if from the future, and is not trusted either; a read dated by the
        // new clock (a following box's next one-entry read, within refresh_s) heals it.
        today.withLockedValue { $0 = read - 3 * 3600 }
        #expect(box.enrolledUsers(of: phone.publicKey).isEmpty)
        var reread = FleetRoster(readAt: today.withLockedValue { $0 })
        reread.add(user: "bob", values: [FleetRoster.value(key: phone.publicKey, name: "")])
        _ = box.fleetRead(reread, requests: 1, seconds: 0.1)
        #expect(box.enrolledUsers(of: phone.publicKey) == ["bob"])
    }

    /// What the box promises in time (a pairing code's life, a held push's wait, a presence
    /// link's keepalive timeout and grace) runs on the monotonic `now` the state is given, never
    /// on the wall clock: hours of wall-clock steps change none of it.
    @Test func wallClockStepsChangeNoDeadline() throws {
        let key = KeyPair.generate()
        let today = NIOLockedValueBox(Date(timeIntervalSince1970: 1_800_000_000))
        var box = try Self.box(enrolling: key, for: "alice", wallClock: { today.withLockedValue { $0 } })
        let now = Duration.seconds(100)
        let (prompt, _) = box.openPrompt(Self.alicesPrompt, owner: nil, pid: 42, now: now)
        var phone = try Phone(key, at: box)
        try phone.open(&box, now: now)
        _ = try phone.push("alice", "correct horse", to: &box, now: now)
        let due = box.nextDeadline
        for step: Double in [-5 * 3600, 26 * 3600, 0] {
            today.withLockedValue { $0 = Date(timeIntervalSince1970: 1_800_000_000 + step) }
            #expect(box.tick(now: now + .seconds(1)).isEmpty)
            #expect(box.nextDeadline == due)
        }
        guard case .answer(.push) = box.enter(prompt, wait: .seconds(10), now: now + .seconds(2)) else {
            Issue.record("the held push did not survive the wall clock's steps"); return
        }
    }

    @Test func aPushAtTheUsersPromptWaitsForEnterThereAndEnterTakesIt() throws {
        let key = KeyPair.generate()
        var box = try Self.box(enrolling: key, for: "alice")
        let now = Duration.seconds(100)
        let (prompt, reply) = box.openPrompt(Self.alicesPrompt, owner: nil, pid: 42, now: now)
        guard case .prompt(let boxID, _, _, _) = reply else { Issue.record("no prompt: \(reply)"); return }
        #expect(boxID == "4821")
        // The advertisement says a prompt waits.
        let adverts = box.take().compactMap { effect -> AdvertisingData? in
            if case .radio(.advertise(let data)) = effect { data } else { nil }
        }
        let flags = try adverts.last.map { try Advertisement.decode($0.manufacturerData[BoxkeyProtocol.companyID]!).flags }
        #expect(flags?.contains(.loginPromptWaiting) == true)

        var phone = try Phone(key, at: box)
        try phone.open(&box, now: now)
        let heard = try phone.push("alice", "correct horse", to: &box, now: now + .milliseconds(50))
        guard case .awaitingEnter(let wait)? = heard.first, heard.count == 1 else { Issue.record("heard \(heard)"); return }
        #expect(wait.seconds == 30)

        // Enter at the prompt: the push, once.
        guard case .answer(.push(let user, let password, _)) = box.enter(prompt, wait: .seconds(10), now: now + .seconds(2)) else {
            Issue.record("Enter did not get the push"); return
        }
        #expect(user == "alice")
        #expect(password.withUnsafeBytes { Array($0) } == Array("correct horse".utf8))
        #expect(box.hasPush(prompt))
        guard case .answer(.noPush(.timedOut)) = box.enter(prompt, wait: .seconds(10), now: now + .seconds(3)) else {
            Issue.record("a second Enter got something"); return
        }
    }

    /// The state changes only once its file is written: a phone whose enrolment could not be
    /// recorded (a full disk, an I/O error) is not enrolled, not even until a restart; a
    /// revocation that could not be recorded still holds (it fails closed) and says so.
    @Test func whatCouldNotBeWrittenIsNotEnrolledAndARevocationFailsClosed() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-registry-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var registry = try PhoneRegistry.load(directory: directory)
        let (alice, bob) = (KeyPair.generate().publicKey, KeyPair.generate().publicKey)
        try registry.enrol(alice, user: "alice", name: "a", by: "test")
        // The next write cannot happen: its temporary file's name is taken by a folder.
        let blocker = directory + "/phones.json.tmp-\(getpid())"
        try FileManager.default.createDirectory(atPath: blocker, withIntermediateDirectories: false)
        #expect(throws: (any Error).self) { try registry.enrol(bob, user: "bob", name: "b", by: "test") }
        #expect(registry.users(of: bob).isEmpty)
        #expect(throws: (any Error).self) { try registry.enrol(alice, user: "carol", name: "a", by: "test") }
        #expect(registry.users(of: alice) == ["alice"])
        #expect { _ = try registry.revoke(fingerprint: alice.fingerprint) } throws: { "\($0)".contains("revoked until boxkeyd restarts") }
        #expect(registry.isRevoked(alice))
        // On disk: the last state that was written, whole.
        try FileManager.default.removeItem(atPath: blocker)
        let reread = try PhoneRegistry.load(directory: directory)
        #expect(reread.users(of: alice) == ["alice"] && reread.users(of: bob).isEmpty)
        var escrow = try EscrowStore.load(directory: directory)
        try FileManager.default.createDirectory(atPath: directory + "/escrow.json.tmp-\(getpid())", withIntermediateDirectories: false)
        let sealed = try JSONDecoder().decode(EscrowSeal.Sealed.self, from: Data(#"{"nonce":[1,2,3],"ciphertext":[4,5,6]}"#.utf8))
        #expect(throws: (any Error).self) { try escrow.keep(sealed, phone: alice, user: "alice") }
        #expect(escrow.sealed(phone: alice, user: "alice") == nil)
    }

    /// A fleet phone of alice's and bob's, its push held at alice's prompt; the box's wall
    /// clock at `today`.
    static func fleetPushHeldAtAlicesPrompt(now: Duration, today: NIOLockedValueBox<Date>) throws -> (box: BoxState, prompt: UInt64, phone: Phone, key: KeyPair) {
        let key = KeyPair.generate()
        var box = try Self.box(enrolling: KeyPair.generate(), for: "carol",
                               configure: { $0.fleet = .init(uri: "ldaps://directory.example", base: "dc=example") },
                               wallClock: { today.withLockedValue { $0 } })
        var roster = FleetRoster(readAt: today.withLockedValue { $0 })
        roster.add(user: "alice", values: [FleetRoster.value(key: key.publicKey, name: "")])
        roster.add(user: "bob", values: [FleetRoster.value(key: key.publicKey, name: "")])
        box.fleetCacheLoaded(roster)
        let (prompt, _) = box.openPrompt(alicesPrompt, owner: nil, pid: 42, now: now)
        var phone = try Phone(key, at: box)
        try phone.open(&box, now: now)
        guard case .awaitingEnter? = try phone.push("alice", "correct horse", to: &box, now: now).first else { throw TestFailure("the push was not held") }
        return (box, prompt, phone, key)
    }

    /// Attack: the phone is revoked for alice in the directory (bob keeps it) while its push
    /// waits at alice's prompt. The revocation kept the phone's links (it still serves bob) and
    /// Enter delivered the held push unchecked: alice was logged in by a revoked phone.
    @Test func aHeldPushIsDroppedWhenThePhoneLosesItsUserAndEnterFindsNothing() throws {
        let now = Duration.seconds(100)
        let today = NIOLockedValueBox(Date(timeIntervalSince1970: 1_800_000_000))
        var (box, prompt, phone, key) = try Self.fleetPushHeldAtAlicesPrompt(now: now, today: today)
        var roster = FleetRoster(readAt: today.withLockedValue { $0 })
        roster.add(user: "bob", values: [FleetRoster.value(key: key.publicKey, name: "")])
        for (lost, still) in box.fleetRead(roster, requests: 1, seconds: 0.1) {  // as Box.fleetRead
            #expect(still == ["bob"])
            box.endLinks(of: lost, keeping: still, reason: "phone revoked in the fleet directory", now: now + .seconds(1))
        }
        let heard = try phone.read(&box, now: now + .seconds(1))
        guard case .loginResult(let result)? = heard.first else { Issue.record("the phone heard \(heard)"); return }
        #expect(result.outcome == .wrongUser)
        #expect(result.reason.contains("no longer enrolled for alice"))
        guard case .answer(.noPush(.nothingYet)) = box.enter(prompt, wait: .seconds(10), now: now + .seconds(2)) else {
            Issue.record("Enter delivered a push held for a user the phone lost"); return
        }
    }

    /// However the phone lost alice (here: the directory's last read grew older than
    /// max_stale_s, so fleet phones vouch for nobody), Enter checks again before it delivers.
    @Test func enterDeliversAHeldPushOnlyIfItsPhoneStillServesTheUser() throws {
        let now = Duration.seconds(100)
        let today = NIOLockedValueBox(Date(timeIntervalSince1970: 1_800_000_000))
        var (box, prompt, phone, _) = try Self.fleetPushHeldAtAlicesPrompt(now: now, today: today)
        today.withLockedValue { $0 += 3601 }
        guard case .answer(.noPush(.nothingYet)) = box.enter(prompt, wait: .seconds(10), now: now + .seconds(2)) else {
            Issue.record("Enter delivered the push of a phone that no longer serves alice"); return
        }
        let heard = try phone.read(&box, now: now + .seconds(2))
        guard case .loginResult(let result)? = heard.first else { Issue.record("the phone heard \(heard)"); return }
        #expect(result.outcome == .wrongUser)
    }

    @Test func aPushForAnotherUserIsRefusedAndThePromptStaysOpen() throws {
        let now = Duration.seconds(100)
        var (box, prompt, phone) = try Self.atAlicesPrompt(phoneFor: "mallory", now: now)
        let heard = try phone.push("alice", "guess", to: &box, now: now)
        guard case .loginResult(let result)? = heard.first else { Issue.record("no answer: \(heard)"); return }
        #expect(result.outcome == .wrongUser)
        guard case .answer(.noPush(.nothingYet)) = box.enter(prompt, wait: .seconds(10), now: now + .seconds(1)) else {
            Issue.record("Enter got a push that was refused"); return
        }
    }

    @Test func aHeldPushNobodyTakesEndsAtTheEnterWaitAndThePhoneHearsSo() throws {
        let now = Duration.seconds(100)
        var (box, prompt, phone) = try Self.atAlicesPrompt(now: now) { $0.enterWait = .seconds(20) }
        _ = try phone.push("alice", "correct horse", to: &box, now: now)
        #expect(box.nextDeadline == now + .seconds(20))
        #expect(box.tick(now: now + .seconds(19)).isEmpty)
        #expect(try phone.read(&box, now: now + .seconds(19)).isEmpty)
        _ = box.tick(now: now + .seconds(20))
        let heard = try phone.read(&box, now: now + .seconds(20))
        guard case .loginResult(let result)? = heard.first else { Issue.record("no answer: \(heard)"); return }
        #expect(result.outcome == .timedOut)
        guard case .answer(.noPush(.nothingYet)) = box.enter(prompt, wait: .seconds(10), now: now + .seconds(21)) else {
            Issue.record("Enter after the wait got the old push"); return
        }
    }

    @Test func anAcceptedLoginOfAPhoneRevokedMeanwhileEarnsNothing() throws {
        let now = Duration.seconds(100)
        var (box, prompt, phone) = try Self.atAlicesPrompt(now: now)
        _ = try phone.push("alice", "correct horse", to: &box, now: now)
        _ = box.enter(prompt, wait: .seconds(10), now: now + .seconds(1))
        let delivered = try #require(box.prompts[prompt])
        let verifying = try #require(delivered.verifying)
        // Revoked while the stack verified the password; then the stack says yes.
        _ = try box.registry.revoke(fingerprint: verifying.phone.fingerprint)
        box.prompts.remove(prompt)
        box.settle(.accepted, reason: "", of: delivered, verifying, who: "alice's phone", now: now + .seconds(2))
        let heard = try phone.read(&box, now: now + .seconds(2))
        guard case .loginResult(let result)? = heard.first else { Issue.record("no answer: \(heard)"); return }
        #expect(result.outcome == .rejected)
        #expect(box.presences.isEmpty)
        #expect(box.registered.entries.isEmpty)
    }

    /// Enter at a proximity offer waits for the phone's push; a wait that ends without the
    /// box (its task cancelled, nobody reading) leaves no Enter behind: the deadline does not
    /// stay due, and a push that comes later is held for the next Enter, not delivered.
    @Test func anEnterWhoseWaitEndedWithoutTheBoxLeavesNothingDue() throws {
        let now = Duration.seconds(100)
        var (box, prompt, phone) = try Self.atAlicesPrompt(now: now) { $0.proximity = true }
        try phone.write(try phone.connection.send(.offer(ProximityOffer(user: "alice", deviceName: "test phone"))), to: &box, now: now)
        _ = try phone.read(&box, now: now)
        guard case .waitForPush = box.enter(prompt, wait: .seconds(10), now: now + .seconds(1)) else {
            Issue.record("Enter at the offer did not wait for the phone"); return
        }
        #expect(try phone.read(&box, now: now + .seconds(1)) == [.intent])
        // The wait was never registered (its task was cancelled first): at its deadline the
        // Enter is over.
        let deadline = try #require(box.nextDeadline)
        _ = box.tick(now: deadline)
        #expect(box.prompts[prompt]?.entered == false)
        #expect(box.nextDeadline == nil || box.nextDeadline! > deadline)
    }

    @Test func aHandshakeThatNeverComesIsCutAtItsTimeoutAndCountsAgainstItsAddress() throws {
        var box = try Self.box(enrolling: KeyPair.generate(), for: "alice")
        let id = CentralID(address: DeviceAddress("AA:BB:CC:00:00:02")!, connection: 7)
        let now = Duration.seconds(100)
        box.handle(.connected(id, mtu: 23), now: now)
        _ = box.take()
        #expect(box.nextDeadline == now + box.config.handshakeTimeout)
        _ = box.tick(now: now + box.config.handshakeTimeout)
        let hungUp = box.take().contains { if case .radio(.disconnect(let d)) = $0 { d == id } else { false } }
        #expect(hungUp)
        #expect(box.failedHandshakes.count(id.address, now: now + box.config.handshakeTimeout) == 1)
    }

    @Test func aMalformedFragmentEndsTheLinkWithAnAuditLine() throws {
        var box = try Self.box(enrolling: KeyPair.generate(), for: "alice")
        let id = CentralID(address: DeviceAddress("AA:BB:CC:00:00:03")!, connection: 9)
        let now = Duration.seconds(100)
        box.handle(.connected(id, mtu: 23), now: now)
        box.handle(.wrote(id, characteristic: BoxkeyProtocol.requestCharacteristicUUID, value: [0xff], mtu: 23), now: now)
        let effects = box.take()
        #expect(effects.contains { if case .radio(.disconnect(let d)) = $0 { d == id } else { false } })
        #expect(effects.contains { if case .audit(let r) = $0 { r.event == .connectionRefused && r.message.contains("bad fragment") } else { false } })
        #expect(box.failedHandshakes.count(id.address, now: now) == 1)
    }

    /// A push with no prompt open, `[unlock] logind_unlock` on: the phone of a box with no
    /// prompt, its push sent, and the unlock job the state asked for.
    static func pushWithNoPrompt(now: Duration) throws -> (box: BoxState, phone: Phone, job: (CredentialPush, PublicKey, CentralID)) {
        let key = KeyPair.generate()
        var box = try box(enrolling: key, for: "alice") { $0.logindUnlock = true }
        var phone = try Phone(key, at: box)
        try phone.open(&box, now: now)
        let push = CredentialPush(user: "alice", password: SecureBytes(copying: Array("correct horse".utf8)), deviceName: "test phone")
        try phone.write(try phone.connection.send(.credentialPush(push)), to: &box, now: now)
        for case .work(.unlockThroughLogind(let push, let phoneKey, let link)) in box.take() { return (box, phone, (push, phoneKey, link)) }
        Issue.record("no unlock job")
        throw CancellationError()
    }

    static let alicesLockedDesktop = LoginSession(id: "7", uid: 1000, user: "alice", tty: "", display: ":0", locked: true, type: "x11")

    @Test func aPushWithNoPromptUnlocksTheOneLockedSessionOnceTheBoxsCheckSaysYes() throws {
        let now = Duration.seconds(100)
        var (box, phone, (push, key, link)) = try Self.pushWithNoPrompt(now: now)
        let uid = box.unlockUID(push, phone: key, on: link, now: now)
        #expect(uid == 1000)
        let unlockedElsewhere = LoginSession(id: "8", uid: 1000, user: "alice", tty: "tty3")
        let target = box.unlockTarget(.success([Self.alicesLockedDesktop, unlockedElsewhere]), push, phone: key, on: link, now: now)
        let check = try #require(target)
        #expect(check.user == "alice")
        let unlocking = box.checked(check, .accepted, now: now + .seconds(1))
        let session = try #require(unlocking)
        #expect(session.id == "7")
        box.unlocked(session, failure: nil, push, phone: key, on: link, now: now + .seconds(1))
        guard case .loginResult(let result)? = try phone.read(&box, now: now + .seconds(1)).first else { Issue.record("no answer"); return }
        #expect(result.outcome == .accepted)
        #expect(box.presences[link]?.user == "alice")
    }

    @Test func twoLockedSessionsAreAmbiguousAndNoPasswordIsChecked() throws {
        let now = Duration.seconds(100)
        var (box, phone, (push, key, link)) = try Self.pushWithNoPrompt(now: now)
        var second = Self.alicesLockedDesktop
        second.id = "9"
        second.display = ":1"
        let target = box.unlockTarget(.success([Self.alicesLockedDesktop, second]), push, phone: key, on: link, now: now)
        #expect(target == nil)
        guard case .loginResult(let result)? = try phone.read(&box, now: now).first else { Issue.record("no answer"); return }
        #expect(result.outcome == .ambiguousPrompt)
    }

    @Test func aPhoneRevokedWhileItsUnlockPasswordWasCheckedUnlocksNothing() throws {
        let now = Duration.seconds(100)
        var (box, phone, (push, key, link)) = try Self.pushWithNoPrompt(now: now)
        let target = box.unlockTarget(.success([Self.alicesLockedDesktop]), push, phone: key, on: link, now: now)
        let check = try #require(target)
        _ = try box.registry.revoke(fingerprint: key.fingerprint)
        let unlocking = box.checked(check, .accepted, now: now + .seconds(1))
        #expect(unlocking == nil)
        guard case .loginResult(let result)? = try phone.read(&box, now: now + .seconds(1)).first else { Issue.record("no answer"); return }
        #expect(result.outcome == .rejected)
        #expect(box.presences.isEmpty)
    }

    @Test func aRefusedUnlockPasswordCountsAgainstThePhone() throws {
        let now = Duration.seconds(100)
        var (box, phone, (push, key, link)) = try Self.pushWithNoPrompt(now: now)
        let target = box.unlockTarget(.success([Self.alicesLockedDesktop]), push, phone: key, on: link, now: now)
        let check = try #require(target)
        let unlocking = box.checked(check, .rejected("Authentication failure"), now: now + .seconds(1))
        #expect(unlocking == nil)
        guard case .loginResult(let result)? = try phone.read(&box, now: now + .seconds(1)).first else { Issue.record("no answer"); return }
        #expect(result.outcome == .rejected)
        let rejections = box.rejectedByPhone.count(key, now: now + .seconds(1))
        #expect(rejections == 1)
    }

    /// A phone asks to attach (become the presence link of alice's session on record); the
    /// state plans it, and the answer comes back after logind was asked.
    static func attaching(now: Duration) throws -> (box: BoxState, phone: Phone, key: KeyPair, plan: BoxState.ActionPlan) {
        let key = KeyPair.generate()
        var box = try box(enrolling: key, for: "alice")
        box.registered.register(LoginSession(id: "5", uid: 1000, user: "alice", tty: "tty1"), service: "login", phone: nil)
        var phone = try Phone(key, at: box)
        try phone.open(&box, now: now)
        try phone.write(try phone.connection.send(.attach), to: &box, now: now)
        let work = box.take().contains { if case .work(.act(.attach, _)) = $0 { true } else { false } }
        #expect(work)
        let planned = box.actionPlan(.attach, on: phone.id)
        let plan = try #require(planned)
        guard case .attach(_, _, "alice") = plan else { Issue.record("plan: \(plan)"); throw CancellationError() }
        return (box, phone, key, plan)
    }

    @Test func anAttachBecomesThePresenceLink() throws {
        let now = Duration.seconds(100)
        var (box, phone, _, plan) = try Self.attaching(now: now)
        box.acted(.attach, plan, .noSession, attaching: "alice", on: phone.id, now: now)
        #expect(box.presences[phone.id]?.user == "alice")
        guard case .actionResult(let result)? = try phone.read(&box, now: now).first else { Issue.record("no answer"); return }
        #expect(result.outcome == .done)
    }

    /// What changed while logind was asked counts: a walk-away lock that landed meanwhile (the
    /// user must push again, not just attach), or a revocation.
    @Test func anAttachAfterAWalkAwayLockOrARevocationMeanwhileIsRefused() throws {
        let now = Duration.seconds(100)
        var (locked, lockedPhone, _, plan) = try Self.attaching(now: now)
        locked.lockedUsers.insert("alice")
        locked.acted(.attach, plan, .noSession, attaching: "alice", on: lockedPhone.id, now: now)
        #expect(locked.presences.isEmpty)
        guard case .actionResult(let result)? = try lockedPhone.read(&locked, now: now).first else { Issue.record("no answer"); return }
        #expect(result.outcome == .noSession)

        var (revoked, revokedPhone, key, plan2) = try Self.attaching(now: now)
        _ = try revoked.registry.revoke(fingerprint: key.publicKey.fingerprint)
        revoked.acted(.attach, plan2, .noSession, attaching: "alice", on: revokedPhone.id, now: now)
        #expect(revoked.presences.isEmpty)
    }

    /// A walk-away acts on the sessions bound to the phone when it went, under the policy of
    /// then: a session bound, or a reload, while the job waits changes nothing.
    @Test func aWalkAwayIsDecidedWhenThePhoneGoes() throws {
        let key = KeyPair.generate()
        var box = try Self.box(enrolling: key, for: "alice") { $0.policy = .logout }
        let bound = LoginSession(id: "6", uid: 1000, user: "alice", tty: "tty1")
        box.registered.register(bound, service: "login", phone: key.publicKey)
        box.queueWalkAway(BoxState.WalkAway(phone: key.publicKey, user: "alice", reason: "gone"))
        box.registered.register(LoginSession(id: "7", uid: 1000, user: "alice", tty: "tty2"), service: "login", phone: key.publicKey)
        let queued = box.take().compactMap { effect -> BoxState.WalkAwayPlan? in
            if case .work(.walkAway(_, let plan)) = effect { plan } else { nil }
        }
        guard case .logout(let sessions)? = queued.first, queued.count == 1 else { Issue.record("queued \(queued)"); return }
        #expect(sessions.map(\.id) == ["6"])
    }
}

extension BoxState {
    /// The effects so far, taken (as `Box` takes them after each change).
    mutating func take() -> [BoxEffect] {
        defer { effects = [] }
        return effects
    }
}
