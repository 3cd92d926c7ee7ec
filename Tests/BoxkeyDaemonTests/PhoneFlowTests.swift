import BoxkeyCore
@testable import BoxkeyDaemon
@testable import BoxkeyPhone
import BoxkeyRadio
import BoxkeyTestWorlds
import Foundation
import NIOConcurrencyHelpers
import Testing

/// The phone's way to a paired box (`Phone.connect`, Connecting.swift) against the real box:
/// the address heard last while its nonce is good, else a scan; one more try when the nonce
/// moved on or the connection's setup failed, and no more. The phone's radio is the simulated
/// air's, seen through `CountingCentral`, which counts what the phone asked of it and can fail
/// connections on purpose.
@Suite(.serialized, .timeLimit(.minutes(1))) struct PhoneFlowTests {
    /// A phone whose radio counts scans and connections, and fails the first `failing` connects
    /// as a Bluetooth stack's GATT setup can.
    final class CountingCentral: CentralRadio {
        let radio: any CentralRadio
        let counts = NIOLockedValueBox((scans: 0, connects: 0, failing: 0, losing: 0, cutting: false, stalling: false))
        init(_ radio: any CentralRadio) { self.radio = radio }
        var address: DeviceAddress { radio.address }
        var scans: Int { counts.withLockedValue { $0.scans } }
        var connects: Int { counts.withLockedValue { $0.connects } }
        func failNext(_ n: Int) { counts.withLockedValue { $0.failing = n } }
        /// The next connection loses its first `n` notifications, as BlueZ drops one sent
        /// before the phone's subscription reached the box.
        func loseNotifications(_ n: Int) { counts.withLockedValue { $0.losing = n } }
        /// The next connection is lost before anything arrives on it.
        func cutNextLink() { counts.withLockedValue { $0.cutting = true } }
        /// The next connection hears nothing, and its Write Requests are never answered: a
        /// box that takes message 1 and says nothing.
        func silenceNextLink() { counts.withLockedValue { $0.losing = .max; $0.stalling = true } }

        func scan(_ filter: ScanFilter) -> AsyncThrowingStream<ScanResult, any Error> {
            counts.withLockedValue { $0.scans += 1 }
            return radio.scan(filter)
        }
        func connect(to address: DeviceAddress, timeout: Duration) async throws -> any CentralLink {
            let fail = counts.withLockedValue { c -> Bool in
                c.connects += 1
                guard c.failing > 0 else { return false }
                c.failing -= 1
                return true
            }
            if fail { throw RadioError.connectionFailed("GATT setup failed (injected)") }
            let link = try await radio.connect(to: address, timeout: timeout)
            let (losing, cutting, stalling) = counts.withLockedValue { c in
                defer { c.losing = 0; c.cutting = false; c.stalling = false }
                return (c.losing, c.cutting, c.stalling)
            }
            return losing > 0 || cutting ? LosingLink(link, losing: losing, cut: cutting, stall: stalling) : link
        }
    }

    /// A link whose first `losing` notifications never arrive, or (`cut`) that is lost at once;
    /// with `stall`, its Write Requests are never answered.
    final class LosingLink: CentralLink {
        let link: any CentralLink
        let events: AsyncStream<LinkEvent>
        let stall: Bool
        init(_ link: any CentralLink, losing: Int, cut: Bool = false, stall: Bool = false) {
            self.link = link
            self.stall = stall
            let (events, continuation) = AsyncStream.makeStream(of: LinkEvent.self)
            self.events = events
            let source = link.events
            if cut {
                continuation.yield(.disconnected(.remoteUser))
                continuation.finish()
                return
            }
            Task {
                var losing = losing
                for await e in source {
                    if case .notification = e, losing > 0 { losing -= 1; continue }
                    continuation.yield(e)
                }
                continuation.finish()
            }
        }
        var peer: DeviceAddress { link.peer }
        var mtu: Int { get async { await link.mtu } }
        func discover(service uuid: String) async throws -> GATTService { try await link.discover(service: uuid) }
        func read(_ characteristic: String) async throws -> [UInt8] { try await link.read(characteristic) }
        func write(_ characteristic: String, value: [UInt8], withResponse: Bool) async throws {
            if stall && withResponse { try await Task.sleep(for: .seconds(3600)) }
            try await link.write(characteristic, value: value, withResponse: withResponse)
        }
        func subscribe(_ characteristic: String) async throws { try await link.subscribe(characteristic) }
        func subscribe(_ characteristic: String, thenWrite target: String, fragments: [[UInt8]]) async throws {
            try await link.subscribe(characteristic, thenWrite: target, fragments: fragments)
        }
        func unsubscribe(_ characteristic: String) async throws { try await link.unsubscribe(characteristic) }
        func rssi() async throws -> Int { try await link.rssi() }
        func disconnect() async { await link.disconnect() }
    }

    /// A phone paired with the harness's box and enrolled there for alice; its radio counted.
    func pairedPhone(_ h: BoxHarness, _ n: UInt8) async throws -> (Phone, CountingCentral) {
        var phone = try freshPhone()
        _ = await h.box.enrolPhone(key: hex(phone.identity.keyPair.publicKey.bytes), user: "alice", name: "flow \(n)")
        try phone.boxes.pin(BoxID(4821)!, key: h.box.identity.keyPair.publicKey, address: BoxHarness.boxAddress)
        return (phone, CountingCentral(try await h.central(DeviceAddress(String(format: "00:50:48:00:02:%02X", n))!)))
    }

    /// What the box advertises now, as a phone would have heard it.
    func heardNow(_ h: BoxHarness) async throws -> HeardBox {
        HeardBox(address: BoxHarness.boxAddress, advertisement: try await h.advertisement(), rssi: nil)
    }

    /// Heard within the box's nonce lifetime (55 s of its 60 s rotation), the phone connects
    /// where it heard the box; heard longer ago, it listens first, since an old nonce in the
    /// handshake would be refused.
    @Test(arguments: [(heardAgo: 50.0, scans: 0), (heardAgo: 56.0, scans: 1)])
    func theCachedAddressServesWhileItsNonceLives(_ cached: (heardAgo: Double, scans: Int)) async throws {
        let h = try await BoxHarness()
        try await h.run {
            var (phone, radio) = try await pairedPhone(h, cached.scans == 0 ? 0x01 : 0x02)
            try phone.boxes.remember(BoxID(4821)!, heard: try await heardNow(h), at: Date().addingTimeInterval(-cached.heardAgo))
            let link = try await phone.connect(to: BoxID(4821)!, radio: radio)
            #expect(radio.scans == cached.scans && radio.connects == 1)
            await link.close()
        }
    }

    /// A box that rotated its nonce sooner than the default refuses the cached advertisement as
    /// stale: the phone listens again and gets in on the fresh one.
    @Test func aStaleCachedAdvertisementMakesThePhoneListenAgain() async throws {
        let h = try await BoxHarness()
        try await h.run {
            var (phone, radio) = try await pairedPhone(h, 0x03)
            try phone.boxes.remember(BoxID(4821)!, heard: try await heardNow(h), at: Date())
            await h.box.rotateNonce()
            await h.box.rotateNonce()
            let link = try await phone.connect(to: BoxID(4821)!, radio: radio)
            #expect(radio.scans == 1 && radio.connects == 2)
            await link.close()
        }
    }

    /// A connection whose setup failed is tried once more on a new one (nothing secret has
    /// moved before the Noise channel opens), after listening again.
    @Test func aFailedConnectionIsTriedOnceMore() async throws {
        let h = try await BoxHarness()
        try await h.run {
            var (phone, radio) = try await pairedPhone(h, 0x04)
            radio.failNext(1)
            let link = try await phone.connect(to: BoxID(4821)!, radio: radio)
            #expect(radio.scans == 2 && radio.connects == 2)
            await link.close()
        }
    }

    /// An answer to message 1 that never reaches the phone (over BlueZ: sent before its
    /// subscription reached the box, while another phone was subscribed) is asked for again:
    /// message 1, the same bytes on the same link, which the box answers again. Losing the
    /// first fragment alone also checks that the rest of the lost answer does not spoil the
    /// repeated one.
    @Test func aLostAnswerToMessageOneIsAskedForAgain() async throws {
        let h = try await BoxHarness()
        try await h.run {
            var (phone, radio) = try await pairedPhone(h, 0x06)
            try phone.boxes.remember(BoxID(4821)!, heard: try await heardNow(h), at: Date())
            let mark = h.journal.mark
            radio.loseNotifications(1)
            let link = try await phone.connect(to: BoxID(4821)!, radio: radio)
            #expect(radio.connects == 1)
            try await h.journal.line(after: mark, containing: "sent message 1 again")
            await link.close()
        }
    }

    /// A box that takes message 1 and never answers costs the phone its timeout and no more:
    /// message 1 goes again as Write Commands, so no request the box leaves unanswered holds
    /// the phone past its deadline.
    @Test func aBoxThatNeverAnswersCostsTheTimeoutAndNoMore() async throws {
        let h = try await BoxHarness()
        try await h.run {
            let (phone, radio) = try await pairedPhone(h, 0x08)
            radio.silenceNextLink()
            let start = ContinuousClock.now
            do {
                let link = try await BoxLink.open(to: try await heardNow(h), boxKey: h.box.identity.keyPair.publicKey, identity: phone.identity,
                                                  radio: radio, timeout: .seconds(2), answerWait: .milliseconds(300))
                await link.close()
                Issue.record("a channel with a box that never answered")
            } catch BoxLink.Failure.timedOut {
                let waited = ContinuousClock.now - start
                #expect(waited < .seconds(4), "gave up after \(waited)")
            }
        }
    }

    /// A link lost before any answer is a failed connection too: over BlueZ a box that hung up
    /// on the phone (a refusal such as "stale advertisement") as its message 1 overtook its
    /// subscription sent words the phone could not hear.
    @Test func aLinkLostBeforeAnyAnswerIsTriedOnceMore() async throws {
        let h = try await BoxHarness()
        try await h.run {
            var (phone, radio) = try await pairedPhone(h, 0x07)
            radio.cutNextLink()
            let link = try await phone.connect(to: BoxID(4821)!, radio: radio)
            #expect(radio.scans == 2 && radio.connects == 2)
            await link.close()
        }
    }

    /// ...and only once: a second failure is the answer, as a radio failure the person can act on.
    @Test func aSecondFailedConnectionIsTheAnswer() async throws {
        let h = try await BoxHarness()
        try await h.run {
            var (phone, radio) = try await pairedPhone(h, 0x05)
            radio.failNext(2)
            do {
                let link = try await phone.connect(to: BoxID(4821)!, radio: radio)
                await link.close()
                Issue.record("connected through two failed connections")
            } catch let error as PhoneFailure {
                #expect(radio.connects == Phone.connectionAttempts)
                #expect(error.message.contains("injected"), "\(error)")
            }
            // The box lost nothing: the same phone gets in now.
            let link = try await phone.connect(to: BoxID(4821)!, radio: radio)
            await link.close()
        }
    }
}

/// Pairing (`Phone.pair`, Pairing.swift) against the real box: the code an admin had the box
/// issue pins the box's key and enrols the phone; a wrong code pins nothing and costs a try.
@Suite(.serialized, .timeLimit(.minutes(1))) struct PairingFlowTests {
    func unpairedPhone(_ h: BoxHarness, _ n: UInt8) async throws -> (Phone, any CentralRadio) {
        (try freshPhone(), try await h.central(DeviceAddress(String(format: "00:50:48:00:03:%02X", n))!))
    }

    /// `boxkeyd pair --user alice`: the code the box shows the admin.
    func adminCode(_ h: BoxHarness, for user: String) async throws -> PairingCode {
        guard case .text(let said) = await h.box.newPairingCode(user: user),
              let digits = said.split(separator: " ").first(where: { $0.count == PairingCode.digits && $0.allSatisfy(\.isNumber) }),
              let code = PairingCode(String(digits)) else { throw TestFailure("no code from the box") }
        return code
    }

    @Test func theBoxsCodePinsItsKeyAndEnrolsThePhone() async throws {
        let h = try await BoxHarness()
        try await h.run {
            var (phone, radio) = try await unpairedPhone(h, 0x01)
            let code = try await adminCode(h, for: "alice")
            let key = try await phone.pair(BoxID(4821)!, code: code, replace: false, radio: radio)
            #expect(key == h.box.identity.keyPair.publicKey && phone.boxes.key(of: BoxID(4821)!) == key)
            // Enrolled for alice: its push at her prompt is taken.
            let prompt = try await h.prompt()
            let link = try await phone.connect(to: BoxID(4821)!, radio: radio)
            try await link.send(.credentialPush(CredentialPush(user: "alice", password: SecureBytes(utf8: "pw"), deviceName: "paired")))
            guard case .awaitingEnter = try await link.next(timeout: .seconds(5)) else { Issue.record("the paired phone's push was not held"); return }
            #expect(await h.box.take(prompt, wait: .seconds(5)).pushedUser == "alice")
            await h.box.report(prompt, .accepted, reason: "")
            await link.close()
            // Paired already: pairing again needs --replace.
            await #expect(throws: PhoneFailure.self) { _ = try await phone.pair(BoxID(4821)!, code: code, replace: false, radio: radio) }
        }
    }

    @Test func aWrongCodePinsNothingAndCostsATry() async throws {
        let h = try await BoxHarness()
        try await h.run {
            var (phone, radio) = try await unpairedPhone(h, 0x02)
            let code = try await adminCode(h, for: "alice")
            let wrong = PairingCode(String(format: "%06d", (Int(code.text)! + 1) % 1_000_000))!
            do {
                _ = try await phone.pair(BoxID(4821)!, code: wrong, replace: false, radio: radio)
                Issue.record("paired under a wrong code")
            } catch let error as PhoneFailure {
                #expect(error.outcome == .pairingFailed, "\(error)")
            }
            #expect(phone.boxes.key(of: BoxID(4821)!) == nil)
            // Under a wrong code the phone cannot read the box's answer and hangs up: the box
            // sees a phone that left without proving the code, and counts the try.
            try await h.journal.line(containing: "pairing attempt", "2 tries left")
            try await h.journal.line(containing: "pairing failed", "without proving the code")
            // The right code still pairs (a try is gone, not the code).
            _ = try await phone.pair(BoxID(4821)!, code: code, replace: false, radio: radio)
            #expect(phone.boxes.key(of: BoxID(4821)!) == h.box.identity.keyPair.publicKey)
        }
    }
}

/// A phone with a fresh identity in a home folder of its own, paired with nothing.
func freshPhone() throws -> Phone {
    let home = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-phone-\(UUID().uuidString.prefix(8))").path
    let dirs = PhoneDirectories(environment: ["HOME": home])
    return Phone(dirs: dirs, identity: try PhoneIdentity.loadOrCreate(dirs), boxes: try PairedBoxes.load(dirs))
}
