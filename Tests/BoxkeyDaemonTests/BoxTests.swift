import BoxkeyCore
@testable import BoxkeyDaemon
import BoxkeyPAMWire
@testable import BoxkeyPhone
import BoxkeyRadio
import BoxkeySimRadio
import BoxkeyBlueZ
import BoxkeyTestWorlds
import Foundation
import Logging
import NIOConcurrencyHelpers
import Testing

/// logind for unit tests: sessions the test declares, and a record of the actions asked (the
/// e2e tests use python-dbusmock's logind through the real D-Bus client).
final class RecordedSessions: SessionControl {
    let calls = NIOLockedValueBox<[String]>([])
    /// Sessions by ID; the prompt process's session (nil: none, as for getty's login).
    let known = NIOLockedValueBox<[String: LoginSession]>([:])
    let promptSession = NIOLockedValueBox<LoginSession?>(nil)
    func add(_ s: LoginSession) { known.withLockedValue { $0[s.id] = s } }
    func session(ofPID pid: Int32) async throws -> LoginSession? { promptSession.withLockedValue { $0 } }
    func session(id: String) async throws -> LoginSession? { known.withLockedValue { $0[id] } }
    func sessions(ofUID uid: UInt32) async throws -> [LoginSession] {
        known.withLockedValue { $0.values.filter { $0.uid == uid }.sorted { $0.id < $1.id } }
    }
    /// As logind with the session's locker: a desktop says it is locked (LockedHint), a text
    /// console (type tty) does not.
    func lock(session: String) async throws {
        calls.withLockedValue { $0.append("lock \(session)") }
        known.withLockedValue { if let s = $0[session], s.type != "tty" { $0[session]!.locked = true } }
    }
    func unlock(session: String) async throws { calls.withLockedValue { $0.append("unlock \(session)") } }
    func terminate(session: String) async throws { calls.withLockedValue { $0.append("terminate \(session)") } }
}

/// The users the unit tests' box knows.
let testUsers: @Sendable (String) -> UInt32? = { ["alice": 1000, "mallory": 1001, "bob": 1002][$0] }
let testPeer = PAMPeer(pid: 4242, uid: 0)

extension Box {
    func failedHandshakeCount(_ address: DeviceAddress) -> Int { state.failedHandshakes.count(address, now: clock.now) }
    /// The phones whose presence links are up.
    func presencePhones() -> [PublicKey] { state.presences.values.map(\.phone) }
}

/// Where the box and its phones meet in a test.
enum AirBackend: String, CaseIterable, CustomTestStringConvertible, Sendable {
    /// One simulated air in this process.
    case inProcess
    /// Two socket airs sharing a private folder, as boxkeyd and boxkey use the simulated radio
    /// between processes: the box's events and the phones' cross Unix sockets.
    case crossProcess
    /// The BlueZ transport on both sides, against bluezoo (a BlueZ D-Bus mock) on a private
    /// bus: the box's adapter and one adapter per phone. Real D-Bus calls, signals and exported
    /// objects; no radio timing or RSSI.
    case bluezoo

    var testDescription: String { rawValue }
}

/// The real Box and RadioService on one backend. The air runs in real time; the box's clock
/// (its timeouts, the timer loop, the presence readings) is the real one unless a test gives
/// it a `ManualClock` to move by hand.
struct BoxHarness {
    let box: Box
    let sessions = RecordedSessions()
    /// Everything the box logs: tests wait here for the box to have seen something.
    let journal = BoxJournal()
    let clock: any RadioClock
    let service: RadioService
    let presence: PresenceService
    let state: String
    private let world: World

    static let boxAddress = DeviceAddress("00:B0:C5:00:48:21")!

    private enum World {
        /// The phones' simulated air (in process, the box's too) and, across processes, the
        /// two socket airs, shut down when the run ends.
        case simulated(SimulatedAir, socketAirs: (box: SocketAir, phones: SocketAir)?)
        case bluezoo(BluezooWorld, BlueZPeripheral, BluezooPhones)
    }

    init(_ backend: AirBackend = .inProcess, clock: any RadioClock = MonotonicClock(),
         configure: (inout DaemonConfig) -> Void = { _ in }) async throws {
        self.clock = clock
        state = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-box-\(UUID().uuidString.prefix(8))").path
        var config = DaemonConfig()
        config.stateDirectory = state
        config.grace = .zero
        configure(&config)
        let identity = try BoxIdentity.loadOrCreate(directory: state, configuredID: BoxID(4821)!)
        // BOXKEY_TEST_LOG=debug shows the box's log while a test runs.
        let logger = journal.logger()
        box = Box(config: config, identity: identity, registry: try PhoneRegistry.load(directory: state), sessions: sessions,
                  clock: clock, logger: logger, radioDescription: "test air", userID: testUsers)
        let peripheral: any PeripheralRadio
        switch backend {
        case .inProcess:
            let air = SimulatedAir(clock: MonotonicClock(), pacing: .realTime)
            peripheral = air.peripheral(Self.boxAddress, at: 0)
            world = .simulated(air, socketAirs: nil)
        case .crossProcess:
            let directory = state + "/air"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            let boxAir = try SocketAir(directory: directory)
            let phoneAir = try SocketAir(directory: directory)
            peripheral = try boxAir.peripheral(Self.boxAddress, at: 0)
            world = .simulated(phoneAir.air, socketAirs: (boxAir, phoneAir))
        case .bluezoo:
            let phones = BluezooPhones()
            let zoo = try await BluezooWorld(adapters: [Self.boxAddress] + phones.adapters)
            do {
                let box = try await BlueZPeripheral(adapter: "hci0", bus: zoo.bus.bus)
                peripheral = box
                world = .bluezoo(zoo, box, phones)
            } catch {
                zoo.close()
                throw error
            }
        }
        presence = PresenceService(box: box, peripheral: peripheral, clock: clock)
        service = RadioService(box: box, peripheral: peripheral, config: config, clock: clock, logger: logger)
    }

    /// The simulated air, where tests move phones (the in-process and cross-process backends).
    var air: SimulatedAir {
        guard case .simulated(let air, _) = world else { preconditionFailure("bluezoo has no simulated air to move phones in") }
        return air
    }

    /// A phone's radio at `address` (over bluezoo: an adapter of its own, the same one for the
    /// same address, which has already heard the box: BlueZ connects only to devices it has
    /// discovered).
    func central(_ address: DeviceAddress) async throws -> any CentralRadio {
        switch world {
        case .simulated(let air, _): return air.central(address, at: 1)
        case .bluezoo(let zoo, _, let phones): return try await phones.central(for: address, on: zoo)
        }
    }

    /// Where the box hears the phone at `address`: there on the simulated air; over bluezoo,
    /// at the address of the adapter that phone was given.
    func onAir(_ address: DeviceAddress) -> DeviceAddress {
        guard case .bluezoo(_, _, let phones) = world else { return address }
        return phones.adapter(for: address) ?? address
    }

    /// Returns once the box has seen the link from `address` end (since `mark`): a phone's
    /// close reaches the box a moment after the phone is done with it.
    func linkEnded(_ address: DeviceAddress, after mark: Int) async throws {
        let prefix = "disconnected \(onAir(address))#"
        try await journal.line(after: mark) { $0.message.hasPrefix(prefix) }
    }

    /// The box's current advertisement, as a phone hears it.
    func advertisement() async throws -> Advertisement {
        try Advertisement.decode(await box.advertisingData.manufacturerData[BoxkeyProtocol.companyID]!)
    }

    /// A phone on the air, enrolled at the box for `enrolledFor` (nil: a stranger's phone).
    func phone(_ n: UInt8, enrolledFor user: String? = nil) async throws -> (PhoneIdentity, any CentralRadio) {
        let identity = PhoneIdentity(keyPair: KeyPair.generate(), deviceSecret: SecureBytes.random(count: 32))
        if let user { _ = await box.enrolPhone(key: hex(identity.keyPair.publicKey.bytes), user: user, name: "test \(n)") }
        return (identity, try await central(DeviceAddress(String(format: "00:50:48:00:00:%02X", n))!))
    }

    /// An enrolled phone connected to the box, its push sent; returns the link.
    func push(_ n: UInt8, user: String = "alice", password: String = "pw") async throws -> BoxLink {
        let (identity, central) = try await phone(n, enrolledFor: user)
        let key = box.identity.keyPair.publicKey
        let heard = try #require(try await findBox(BoxID(4821)!, pinned: key, radio: central, timeout: .seconds(5)))
        let link = try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: central)
        try await link.send(.credentialPush(CredentialPush(user: user, password: SecureBytes(utf8: password), deviceName: "test")))
        return link
    }

    /// A waiting prompt on a local console (tty), as getty's login asks once the name is typed.
    func prompt(tty: String = "tty1", service: String = "login", user: String = "alice", seconds: UInt32 = 10) async throws -> UInt64 {
        let (id, reply) = await box.registerPrompt(.init(service: service, tty: tty, display: "", expectedUser: user,
                                                         timeoutMilliseconds: seconds * 1000), peer: testPeer)
        return try #require(id, "not offered: \(reply)")
    }

    /// An honest phone logs in through a waiting prompt: proof that the box still serves.
    /// Returns the link, which stays the presence link unless closed.
    @discardableResult
    func honestLogin(_ n: UInt8 = 0x01, user: String = "alice", keep: Bool = false, answerWait: Duration = BoxLink.answerWait) async throws -> BoxLink? {
        let (identity, central) = try await phone(n, enrolledFor: user)
        let key = box.identity.keyPair.publicKey
        let prompt = try await self.prompt(tty: "tty\(n % 60 + 1)", user: user)
        let heard = try #require(try await findBox(BoxID(4821)!, pinned: key, radio: central, timeout: .seconds(5)))
        let link = try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: central, answerWait: answerWait)
        try await link.send(.credentialPush(CredentialPush(user: user, password: SecureBytes(utf8: "pw"), deviceName: "honest")))
        // The push waits at the prompt; the person there presses Enter.
        guard case .awaitingEnter = try await link.next(timeout: .seconds(5)) else { Issue.record("the honest phone's push did not wait at the prompt"); return nil }
        guard let pushed = await box.take(prompt, wait: .seconds(10)).pushedUser else { Issue.record("the honest phone's push did not arrive"); return nil }
        #expect(pushed == user)
        await box.report(prompt, .accepted, reason: "")
        guard case .loginResult(let result) = try await link.next(timeout: .seconds(5)) else { Issue.record("no login result"); return nil }
        #expect(result.outcome == .accepted)
        if keep { return link }
        await link.close()
        return nil
    }

    /// Runs `body` with the box serving.
    func run(_ body: @Sendable @escaping () async throws -> Void) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await service.run() }
            group.addTask { try await presence.run() }
            // The body starts once a phone can hear the box (a connect before the first
            // advertisement would wait out its whole timeout).
            let listener = try await central(DeviceAddress("00:50:48:00:FF:FF")!)
            _ = try #require(try await findBox(BoxID(4821)!, pinned: box.identity.keyPair.publicKey, radio: listener, timeout: .seconds(5)))
            try await body()
            group.cancelAll()
        }
        switch world {
        case .simulated(_, let socketAirs):
            socketAirs?.phones.shutdown()
            socketAirs?.box.shutdown()
        case .bluezoo(let zoo, let peripheral, let phones):
            phones.close()
            await peripheral.close()
            zoo.close()
        }
        try? FileManager.default.removeItem(atPath: state)
    }
}

/// The phones' adapters in a bluezoo world, handed out by address as tests ask for phones.
final class BluezooPhones: Sendable {
    /// Enough for the most phones one test uses (six) and the harness's listener.
    let adapters = (1...9).map { DeviceAddress(String(format: "00:50:48:AA:00:%02X", $0))! }
    private struct Given {
        var index: [DeviceAddress: Int] = [:]
        var centrals: [DeviceAddress: BlueZCentral] = [:]
    }
    private let given = NIOLockedValueBox(Given())

    func central(for address: DeviceAddress, on zoo: BluezooWorld) async throws -> BlueZCentral {
        let (index, existing) = given.withLockedValue { g -> (Int, BlueZCentral?) in
            if let i = g.index[address] { return (i, g.centrals[address]) }
            g.index[address] = g.index.count
            return (g.index.count - 1, nil)
        }
        if let existing { return existing }
        guard index < adapters.count else { throw TestFailure("more phones than bluezoo adapters (\(adapters.count))") }
        // hci0 is the box's.
        let central = try await BlueZCentral(adapter: "hci\(index + 1)", bus: zoo.bus.bus)
        given.withLockedValue { $0.centrals[address] = central }
        for try await r in central.scan(ScanFilter(serviceUUIDs: [BoxkeyProtocol.serviceUUID])) where r.address == BoxHarness.boxAddress { break }
        return central
    }

    /// The address of the adapter given to the phone at `address`.
    func adapter(for address: DeviceAddress) -> DeviceAddress? {
        given.withLockedValue { $0.index[address].map { adapters[$0] } }
    }

    func close() { given.withLockedValue { $0.centrals.values.forEach { $0.close() } } }
}

@Suite(.serialized, .timeLimit(.minutes(1))) struct BoxTests {
    @Test func floodingAddressIsCutOffWhileOtherPhonesLogIn() async throws {
        // The garbage is a continuation before any first fragment, which the box holds until
        // the handshake timeout: 1 s here, not the default 5.
        let h = try await BoxHarness {
            $0.failedHandshakesPerMinute = 3
            $0.handshakeTimeout = .seconds(1)
        }
        try await h.run {
            let (_, attacker) = try await h.phone(0x66)
            // Garbage instead of a handshake, from one address, until it is cut off.
            for _ in 0..<3 {
                let link = try await attacker.connect(to: DeviceAddress("00:B0:C5:00:48:21")!, timeout: .seconds(5))
                try await link.subscribe(BoxkeyProtocol.responseCharacteristicUUID)
                try await link.write(BoxkeyProtocol.requestCharacteristicUUID, value: [0, 0, 4, 1, 3, 0, 0], withResponse: true)
                var events = link.events.makeAsyncIterator()
                while let e = await events.next() { if case .disconnected = e { break } }
            }
            // The address is over its budget: an unknown key from it is refused after message 1 (as not enrolled: it is not).
            let again = try await attacker.connect(to: DeviceAddress("00:B0:C5:00:48:21")!, timeout: .seconds(5))
            try await again.subscribe(BoxkeyProtocol.responseCharacteristicUUID)
            let advert = try await h.advertisement()
            var stranger = PhoneConnection(identity: KeyPair.generate(), boxKey: h.box.identity.keyPair.publicKey, advertisement: advert)
            let channel = FrameChannel.random()
            for f in try Framing.fragment(try stranger.start(), mtu: 23, channel: channel) {
                try await again.write(BoxkeyProtocol.requestCharacteristicUUID, value: f, withResponse: false)
            }
            var reassembler = FrameReassembler(channel: channel)
            var answer: [UInt8]?
            for await e in again.events {
                if case .notification(_, let v) = e, let m = try reassembler.receive(v, mtu: 23, now: .zero) { answer = m }
                if case .disconnected = e { break }
            }
            #expect(answer == Envelope.refusal(Refusal(.notEnrolled)).encode())

            // Another phone, meanwhile, logs in; so does an enrolled phone at the flooded
            // address (an attacker may borrow an honest phone's address to flood from).
            try await h.honestLogin()
            try await h.honestLogin(0x66)
        }
    }

    /// One enrolled key opening link after link (from ever new addresses, as an attacker who
    /// copied a phone's key, or a buggy phone, would) holds two slots, not the whole box.
    @Test(arguments: AirBackend.allCases) func onePhoneKeyHoldsAtMostTwoSlots(_ air: AirBackend) async throws {
        let h = try await BoxHarness(air)
        try await h.run {
            let (identity, _) = try await h.phone(0x30, enrolledFor: "alice")
            let key = h.box.identity.keyPair.publicKey
            var held: [BoxLink] = []
            for n in 0..<3 {
                let central = try await h.central(DeviceAddress(String(format: "00:50:48:00:01:%02X", n))!)
                let heard = try #require(try await findBox(BoxID(4821)!, pinned: key, radio: central, timeout: .seconds(5)))
                do {
                    held.append(try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: central))
                    #expect(n < 2, "a third link for one key was let in")
                } catch BoxLink.Failure.refused(let r) {
                    #expect(n == 2 && r.code == .busy, "link \(n) refused: \(r.code)")
                }
            }
            #expect(held.count == 2)
            try await h.honestLogin(0x31)           // another phone still gets in
            let mark = h.journal.mark
            await held[0].close()
            try await h.linkEnded(DeviceAddress("00:50:48:00:01:00")!, after: mark)
            let central = try await h.central(DeviceAddress("00:50:48:00:01:10")!)
            let heard = try #require(try await findBox(BoxID(4821)!, pinned: key, radio: central, timeout: .seconds(5)))
            held.append(try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: central))  // a slot freed
            for link in held { await link.close() }
        }
    }

    /// A phone that waits for no answer sends message 1 again at once, twice: the box answers
    /// each time with the same bytes, and the phone takes the first and passes over the others.
    @Test(arguments: AirBackend.allCases) func anAnswerThatComesThreeTimesIsTakenOnce(_ air: AirBackend) async throws {
        let h = try await BoxHarness(air)
        try await h.run {
            let mark = h.journal.mark
            try await h.honestLogin(0x40, answerWait: .zero)
            #expect(h.journal.lines.dropFirst(mark).filter { $0.message.contains("sent message 1 again") }.count == BoxConnection.maxRepeatedAnswers)
        }
    }

    /// BlueZ (and the model of it) sends every notification to every subscribed phone: two
    /// phones logging in at once each get their own answers, rounds after rounds.
    @Test(arguments: AirBackend.allCases) func twoPhonesLoggingInAtOnceEachGetTheirOwnAnswers(_ air: AirBackend) async throws {
        let h = try await BoxHarness(air)
        try await h.run {
            for round in 0..<3 {
                // Each prompt names its user, as a greeter with a user list does: a prompt for anyone
                // would make the other push ambiguous.
                async let a: BoxLink? = h.honestLogin(UInt8(0x10 + round), user: "mallory")
                async let b: BoxLink? = h.honestLogin(UInt8(0x20 + round), user: "bob")
                _ = try await (a, b)
            }
        }
    }

    /// A phone that floods the box with garbage is dropped at its first bad fragment; the
    /// writes already queued behind it are discarded, not each counted as another failure.
    @Test func aFloodIsCountedOnceNotOncePerQueuedWrite() async throws {
        let h = try await BoxHarness { $0.failedHandshakesPerMinute = 3 }
        try await h.run {
            let (_, attacker) = try await h.phone(0x66)
            let link = try await attacker.connect(to: DeviceAddress("00:B0:C5:00:48:21")!, timeout: .seconds(5))
            try await link.subscribe(BoxkeyProtocol.responseCharacteristicUUID)
            for _ in 0..<40 { try? await link.write(BoxkeyProtocol.requestCharacteristicUUID, value: [1, 2, 3, 4, 3, 0, 0], withResponse: false) }
            var events = link.events.makeAsyncIterator()
            while let e = await events.next() { if case .disconnected = e { break } }
            #expect(await h.box.failedHandshakeCount(DeviceAddress("00:50:48:00:00:66")!) == 1)
            // The same address is still welcome: an honest phone there logs in.
            try await h.honestLogin(0x66)
        }
    }

    /// The timer loop sleeps until the next thing is due: with a phone connected and nothing
    /// due for 30 s, it goes to sleep until then after a tick or two. (It used to ring its own
    /// doorbell from inside a tick and spin thousands of times a second; then it never sleeps
    /// until the deadline, and this test fails on the wait.)
    @Test func aConnectedPhoneDoesNotKeepTheTimersBusy() async throws {
        let clock = ManualClock(now: .seconds(100))
        let h = try await BoxHarness(clock: clock) { $0.handshakeTimeout = .seconds(30) }
        try await h.run {
            let (_, phone) = try await h.phone(0x07)
            let link = try await phone.connect(to: DeviceAddress("00:B0:C5:00:48:21")!, timeout: .seconds(5))
            try await h.journal.line { $0.message.hasPrefix("connected \(h.onAir(DeviceAddress("00:50:48:00:00:07")!))#") }
            #expect(await clock.someoneSleeps(until: clock.now + .seconds(30)), "the timer loop never went to sleep until the handshake's deadline")
            #expect(await h.box.ticks <= 2)
            await link.disconnect()
        }
    }

    /// Steps the box's clock to its next presence reading and returns once the box has taken it:
    /// the journal line that reading caused (the reading itself, or what it changed).
    func nextReading(_ h: BoxHarness, _ clock: ManualClock, every interval: Duration) async throws -> BoxJournal.Line {
        // Once the presence service sleeps until the reading is due: moved before that, the
        // clock would make it sleep 5 ms past the due time, which the test never reaches.
        guard await clock.someoneSleeps(until: clock.now + interval) else { throw TestFailure("the presence service is not asleep until its next reading") }
        let mark = h.journal.mark
        clock.advance(by: interval)
        return try await h.journal.line(after: mark) {
            $0.message.hasPrefix("RSSI of") || $0.message.hasPrefix("signal ") || $0.message.hasPrefix("walked away")
        }
    }

    /// The presence service reads the link's RSSI from the air on the box's clock; a mean
    /// below the lock threshold for `away_after_s` locks the session, the link still up.
    @Test func weakSignalForLongEnoughLocksWithoutLosingTheLink() async throws {
        let clock = ManualClock(now: .seconds(100))
        let h = try await BoxHarness(clock: clock) { c in
            c.rssiInterval = .milliseconds(100)
            c.rssiSamples = 5
            c.awayAfter = .milliseconds(500)
        }
        try await h.run {
            let link = try #require(try await h.honestLogin(0x31, keep: true))
            h.sessions.add(LoginSession(id: "42", uid: 1000, user: "alice", tty: "tty1"))
            await h.box.openSession(user: "alice", sessionID: "42", service: "login", ticket: "")
            try await h.journal.line { $0.message.hasPrefix("presence link up") }
            // Near the box: ten readings change nothing.
            for _ in 0..<10 {
                let line = try await nextReading(h, clock, every: .milliseconds(100))
                #expect(line.message.hasPrefix("RSSI of"), "near the box: \(line)")
            }
            #expect(h.sessions.calls.withLockedValue { $0 }.isEmpty)
            // 15 m: still in range (30 m) but about -88 dBm, below the -80 dBm lock threshold.
            h.air.move(DeviceAddress("00:50:48:00:00:31")!, to: 15)
            var weakAt: Duration?
            var line = try await nextReading(h, clock, every: .milliseconds(100))
            for _ in 0..<20 where !line.message.hasPrefix("walked away") {
                if line.message.hasPrefix("signal weak") { weakAt = clock.now }
                line = try await nextReading(h, clock, every: .milliseconds(100))
            }
            #expect(line.message.hasPrefix("walked away") && line.message.contains("signal below -80 dBm"), "\(line)")
            // Five readings to fill the mean, then half a second below the threshold.
            let weak = try #require(weakAt, "the countdown never started")
            #expect(clock.now - weak == .milliseconds(500))
            try await h.journal.line(containing: "walk-away lock: session 42")
            #expect(h.sessions.calls.withLockedValue { $0 } == ["lock 42"])
            await link.close()
        }
    }

    @Test func briefDipThenComingCloseCancelsTheCountdown() async throws {
        let clock = ManualClock(now: .seconds(100))
        let h = try await BoxHarness(clock: clock) { c in
            c.rssiInterval = .milliseconds(100)
            c.rssiSamples = 5
            c.awayAfter = .milliseconds(1500)
        }
        try await h.run {
            let link = try #require(try await h.honestLogin(0x32, keep: true))
            h.sessions.add(LoginSession(id: "43", uid: 1000, user: "alice", tty: "tty1"))
            await h.box.openSession(user: "alice", sessionID: "43", service: "login", ticket: "")
            try await h.journal.line { $0.message.hasPrefix("presence link up") }
            let phone = DeviceAddress("00:50:48:00:00:32")!
            // Below -80 dBm long enough for the mean: the countdown starts.
            h.air.move(phone, to: 15)
            var line = try await nextReading(h, clock, every: .milliseconds(100))
            for _ in 0..<10 where !line.message.hasPrefix("signal weak") { line = try await nextReading(h, clock, every: .milliseconds(100)) }
            #expect(line.message.hasPrefix("signal weak"), "\(line)")
            let weak = clock.now
            // About -52 dBm: above the -60 dBm return threshold, before the 1.5 s are up.
            h.air.move(phone, to: 0.5)
            for _ in 0..<10 where !line.message.hasPrefix("signal back") { line = try await nextReading(h, clock, every: .milliseconds(100)) }
            #expect(line.message.hasPrefix("signal back") && clock.now - weak < .milliseconds(1500), "\(line)")
            // More than the countdown on, near: no walk-away.
            for _ in 0..<20 {
                line = try await nextReading(h, clock, every: .milliseconds(100))
                #expect(line.message.hasPrefix("RSSI of"), "\(line)")
            }
            #expect(h.sessions.calls.withLockedValue { $0 }.isEmpty)
            await link.close()
        }
    }

    @Test func slowConnectionIsDroppedAtTheHandshakeTimeout() async throws {
        let h = try await BoxHarness { $0.handshakeTimeout = .seconds(1) }
        try await h.run {
            let (_, slow) = try await h.phone(0x42)
            let clock = MonotonicClock()
            let start = clock.now
            let link = try await slow.connect(to: DeviceAddress("00:B0:C5:00:48:21")!, timeout: .seconds(5))
            var events = link.events.makeAsyncIterator()
            #expect(await events.next() == .disconnected(.remoteUser))
            let waited = clock.now - start
            #expect(waited >= .milliseconds(900) && waited < .seconds(3), "dropped after \(waited)")
        }
    }
}

/// A central that records what its links are asked to do, around the simulated one.
final class RecordingCentral: CentralRadio {
    let inner: any CentralRadio
    let calls = NIOLockedValueBox<[String]>([])
    init(_ inner: any CentralRadio) { self.inner = inner }
    var address: DeviceAddress { inner.address }
    func scan(_ filter: ScanFilter) -> AsyncThrowingStream<ScanResult, any Error> { inner.scan(filter) }
    func connect(to address: DeviceAddress, timeout: Duration) async throws -> any CentralLink {
        RecordingLink(try await inner.connect(to: address, timeout: timeout), calls: calls)
    }
}

final class RecordingLink: CentralLink {
    let inner: any CentralLink
    let calls: NIOLockedValueBox<[String]>
    init(_ inner: any CentralLink, calls: NIOLockedValueBox<[String]>) { self.inner = inner; self.calls = calls }
    private func note(_ s: String) { calls.withLockedValue { $0.append(s) } }
    var peer: DeviceAddress { inner.peer }
    var events: AsyncStream<LinkEvent> { inner.events }
    var mtu: Int { get async { await inner.mtu } }
    func discover(service uuid: String) async throws -> GATTService { try await inner.discover(service: uuid) }
    func read(_ c: String) async throws -> [UInt8] { try await inner.read(c) }
    func write(_ c: String, value: [UInt8], withResponse: Bool) async throws { try await inner.write(c, value: value, withResponse: withResponse) }
    func subscribe(_ c: String) async throws { note("subscribe"); try await inner.subscribe(c) }
    func unsubscribe(_ c: String) async throws { note("unsubscribe"); try await inner.unsubscribe(c) }
    func rssi() async throws -> Int { try await inner.rssi() }
    func disconnect() async { note("disconnect"); await inner.disconnect() }
}

@Suite(.serialized, .timeLimit(.minutes(1))) struct BoxLinkTests {
    /// A phone done with a box unsubscribes from its notifications before it disconnects, as
    /// a well-behaved central does (BlueZ would otherwise keep notifying a central on its way out).
    @Test func closingUnsubscribesBeforeDisconnecting() async throws {
        let h = try await BoxHarness()
        try await h.run {
            let (identity, central) = try await h.phone(0x21, enrolledFor: "alice")
            let recording = RecordingCentral(central)
            let key = h.box.identity.keyPair.publicKey
            let heard = try #require(try await findBox(BoxID(4821)!, pinned: key, radio: recording, timeout: .seconds(5)))
            let link = try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: recording)
            await link.close()
            await link.close()  // a second close does nothing
            #expect(recording.calls.withLockedValue { $0 } == ["subscribe", "unsubscribe", "disconnect"])
        }
    }
}
