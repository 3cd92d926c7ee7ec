@testable import BoxkeyCore
@testable import BoxkeyDaemon
import BoxkeyPAMWire
@testable import BoxkeyPhone
import BoxkeyRadio
import BoxkeySimRadio
import Foundation
import Testing

/// Attacks on the real box (Box + RadioService on the simulated air). Each test runs the
/// attack, checks how the box answered, and then logs an honest phone in to show the box kept
/// serving and lost nothing.
@Suite(.serialized, .timeLimit(.minutes(1))) struct AttackTests {
    static let box = DeviceAddress("00:B0:C5:00:48:21")!

    /// A phone that writes whatever bytes it likes.
    struct RawPhone {
        let link: any CentralLink
        var events: AsyncStream<LinkEvent>.Iterator
        let channel: FrameChannel
        var reassembler: FrameReassembler
        /// The link's ATT MTU: the box's fragments are as large as it allows (bluezoo: 512).
        let mtu: Int

        /// On a fresh channel, or on `channel` (a copy of another phone's).
        static func connect(_ h: BoxHarness, _ n: UInt8, channel: FrameChannel = .random()) async throws -> RawPhone {
            let (_, central) = try await h.phone(n)
            let link = try await central.connect(to: AttackTests.box, timeout: .seconds(5))
            // As a phone does: the service's objects may reach a BlueZ central a moment after
            // the link is up, and discovery waits for them.
            _ = try await link.discover(service: BoxkeyProtocol.serviceUUID)
            try await link.subscribe(BoxkeyProtocol.responseCharacteristicUUID)
            return RawPhone(link: link, events: link.events.makeAsyncIterator(), channel: channel, reassembler: FrameReassembler(channel: channel),
                            mtu: await link.mtu)
        }

        func write(_ fragments: [[UInt8]]) async throws {
            for f in fragments { try await link.write(BoxkeyProtocol.requestCharacteristicUUID, value: f, withResponse: false) }
        }

        func send(_ envelope: [UInt8]) async throws { try await write(try Framing.fragment(envelope, mtu: 23, channel: channel)) }

        /// The next envelope from the box, or nil when the box disconnects.
        mutating func receive() async -> [UInt8]? {
            while let event = await events.next() {
                switch event {
                case .notification(_, let value):
                    if let message = try? reassembler.receive(value, mtu: mtu, now: .zero) { return message }
                case .disconnected:
                    return nil
                }
            }
            return nil
        }

        mutating func expectDisconnect() async -> Bool {
            while let event = await events.next() { if case .disconnected = event { return true } }
            return true
        }
    }


    @Test(arguments: AirBackend.allCases) func replayedHandshakeIsRefused(_ air: AirBackend) async throws {
        let h = try await BoxHarness(air)
        try await h.run {
            var phone = PhoneConnection(identity: await h.enrolledKey(), boxKey: h.box.identity.keyPair.publicKey, advertisement: try await h.advertisement())
            let recorded = try phone.start()
            var first = try await RawPhone.connect(h, 0x10)
            try await first.send(recorded)
            let answer = try #require(await first.receive())
            #expect(try Envelope.decode(answer).isHandshakeResponse)
            // An attacker replays message 1 on a new connection.
            var replay = try await RawPhone.connect(h, 0x11)
            try await replay.send(recorded)
            #expect(await replay.receive() == Envelope.refusal(Refusal(.replayedHandshake)).encode())
            try await h.honestLogin()
        }
    }

    @Test(arguments: AirBackend.allCases) func replayedCredentialMessageIsRejected(_ air: AirBackend) async throws {
        let h = try await BoxHarness(air)
        try await h.run {
            let key = h.box.identity.keyPair.publicKey
            let phoneKey = await h.enrolledKey()
            // The victim's session: the attacker records its credential message.
            var victim = PhoneConnection(identity: phoneKey, boxKey: key, advertisement: try await h.advertisement())
            var a = try await RawPhone.connect(h, 0x20)
            try await a.send(try victim.start())
            _ = try victim.receive(try #require(await a.receive()))
            let recorded = try victim.send(.credentialPush(CredentialPush(user: "alice", password: SecureBytes(utf8: "secret"), deviceName: "victim")))
            await a.link.disconnect()
            // The attacker opens its own channel and plays the recording into it.
            let prompt = try await h.prompt(tty: "tty9", seconds: 3)
            var attacker = PhoneConnection(identity: await h.enrolledKey(), boxKey: key, advertisement: try await h.advertisement())
            var b = try await RawPhone.connect(h, 0x21)
            try await b.send(try attacker.start())
            _ = try attacker.receive(try #require(await b.receive()))
            try await b.send(recorded)
            #expect(await b.expectDisconnect())
            // Nothing reached the prompt: Enter there finds no push, and the prompt goes away.
            #expect(await h.box.take(prompt, wait: .seconds(10)).pushedUser == nil)
            await h.box.promptClosed(prompt)
            try await h.honestLogin()
        }
    }

    @Test(arguments: AirBackend.allCases) func staleAdvertisementFromARelayIsRefused(_ air: AirBackend) async throws {
        let h = try await BoxHarness(air)
        try await h.run {
            let old = try await h.advertisement()
            await h.box.rotateNonce()
            await h.box.rotateNonce()
            var phone = PhoneConnection(identity: KeyPair.generate(), boxKey: h.box.identity.keyPair.publicKey, advertisement: old)
            var raw = try await RawPhone.connect(h, 0x30)
            try await raw.send(try phone.start())
            #expect(await raw.receive() == Envelope.refusal(Refusal(.staleAdvertisement)).encode())
            try await h.honestLogin()
        }
    }

    /// A message that stops mid-way on an open channel is dropped at the documented 5 s, not
    /// at the next deadline the timer loop happened to know (the 10 s command timeout).
    @Test func aStalledMessageIsDroppedAfterFiveSeconds() async throws {
        let h = try await BoxHarness()
        try await h.run {
            var phone = PhoneConnection(identity: await h.enrolledKey(), boxKey: h.box.identity.keyPair.publicKey, advertisement: try await h.advertisement())
            var raw = try await RawPhone.connect(h, 0x62)
            try await raw.send(try phone.start())
            _ = try phone.receive(try #require(await raw.receive()))
            let sealed = try phone.sealRawForTest([UInt8](repeating: 0x7e, count: 200))
            let start = ContinuousClock.now
            try await raw.write([try Framing.fragment(sealed, mtu: 23, channel: raw.channel)[0]])
            #expect(await raw.receive() == nil)
            let waited = ContinuousClock.now - start
            #expect(waited >= .milliseconds(4900) && waited < .milliseconds(6500), "dropped after \(waited)")
        }
    }

}

/// The attacks on another connection's channel, and unknown versions: a lane of their own
/// beside `AttackTests` (each is a box per backend, bluezoo's the slowest).
@Suite(.serialized, .timeLimit(.minutes(1))) struct ChannelAttackTests {
    typealias RawPhone = AttackTests.RawPhone

    /// Notifications reach every subscribed phone, tagged with the connection's channel. A
    /// phone that copies another connection's channel (seen on the air) is hung up on without a
    /// word: anything the box said on that channel would reach the other phone.
    @Test(arguments: AirBackend.allCases) func anotherConnectionsChannelIsRefusedSilently(_ air: AirBackend) async throws {
        let h = try await BoxHarness(air)
        try await h.run {
            let key = h.box.identity.keyPair.publicKey
            var honest = PhoneConnection(identity: await h.enrolledKey(), boxKey: key, advertisement: try await h.advertisement())
            var a = try await RawPhone.connect(h, 0x60)
            var copycat = try await RawPhone.connect(h, 0x61, channel: a.channel)
            var mallory = PhoneConnection(identity: KeyPair.generate(), boxKey: key, advertisement: try await h.advertisement())
            let first = try honest.start()
            try await a.send(first)
            // The honest phone's answer arrives (the copycat hears it too: that is the air). The
            // copy comes after it, as on the air, where the channel is seen only once in use:
            // sent at once, the copycat's first fragment could reach the box first (two
            // connections' writes have no order) and make the honest phone the copier.
            let answer = try #require(await a.receive())
            _ = try honest.receive(answer)
            // The box hangs up at the first fragment: over BlueZ the rest of the send may fail.
            try? await copycat.send(try mallory.start())
            // The copycat gets nothing of its own: the box only hangs up.
            var heard: [[UInt8]] = []
            while let m = await copycat.receive() { heard.append(m) }
            #expect(heard.allSatisfy { $0 == answer })
            try await h.honestLogin()
        }
    }

    /// The same copy, but with a broken first fragment: the box's refusal of a malformed
    /// fragment must not go out on the copied channel (the victim would take it as its own
    /// and end its login or presence link).
    @Test(arguments: AirBackend.allCases) func aBrokenFragmentOnACopiedChannelGetsNoRefusalOnIt(_ air: AirBackend) async throws {
        let h = try await BoxHarness(air)
        try await h.run {
            let key = h.box.identity.keyPair.publicKey
            var honest = PhoneConnection(identity: await h.enrolledKey(), boxKey: key, advertisement: try await h.advertisement())
            var a = try await RawPhone.connect(h, 0x63)
            try await a.send(try honest.start())
            _ = try honest.receive(try #require(await a.receive()))
            for broken: [UInt8] in [[0x01, 0x00], [0xFF, 1], [0, 0, 0, 1], [0, 0, 1]] {
                var copycat = try await RawPhone.connect(h, 0x64)
                try await copycat.write([a.channel.bytes + broken])
                #expect(await copycat.expectDisconnect())
            }
            // The honest phone's next answer is the first thing on its channel, not a refusal.
            try await a.send(try honest.send(.credentialPush(CredentialPush(user: "alice", password: SecureBytes(utf8: "pw"), deviceName: "a"))))
            guard case .loginResult(let result) = try honest.receive(try #require(await a.receive())) else { Issue.record("no login result"); return }
            #expect(result.outcome == .notAtPrompt)
        }
    }

    @Test(arguments: AirBackend.allCases) func unknownVersionAndMessageType(_ air: AirBackend) async throws {
        let h = try await BoxHarness(air)
        try await h.run {
            var phone = PhoneConnection(identity: KeyPair.generate(), boxKey: h.box.identity.keyPair.publicKey, advertisement: try await h.advertisement())
            var first = try phone.start()
            first[0] = 9
            var raw = try await RawPhone.connect(h, 0x50)
            try await raw.send(first)
            #expect(await raw.receive() == Envelope.refusal(Refusal(.unsupportedVersion)).encode())

            // A valid channel carrying an application message type this version does not know.
            var second = PhoneConnection(identity: await h.enrolledKey(), boxKey: h.box.identity.keyPair.publicKey, advertisement: try await h.advertisement())
            var raw2 = try await RawPhone.connect(h, 0x51)
            try await raw2.send(try second.start())
            _ = try second.receive(try #require(await raw2.receive()))
            try await raw2.send(try second.sealRawForTest([0x7e]))
            let error = try #require(await raw2.receive())
            #expect(throws: PhoneConnection.Error.boxError(ChannelError(.malformed, detail: "unknownType(126)"))) { try second.receive(error) }
            try await h.honestLogin()
        }
    }
}

extension BoxHarness {
    /// A key enrolled at the box for alice: these attacks come from an enrolled (malicious or
    /// recorded) phone, since unknown keys are refused right after message 1.
    func enrolledKey() async -> KeyPair {
        let key = KeyPair.generate()
        _ = await box.enrolPhone(key: hex(key.publicKey.bytes), user: "alice", name: "attacker")
        return key
    }
}

extension Envelope {
    var isHandshakeResponse: Bool { if case .handshakeResponse = self { true } else { false } }
}

/// Broken framing from a phone, one case per kind of break. Each case has a box of its own, so
/// the cases run side by side.
@Suite(.timeLimit(.minutes(1))) struct MalformedFrameTests {
    @Test(arguments: [
        // After the channel (which the test adds): index, length, data.
        ("truncated: a new message before the last ended", [[0, 0, 100] + [UInt8](repeating: 1, count: 13), [0, 0, 10, 1, 2, 3]]),
        ("oversize declared length", [[0, 0x10, 0x00] + [UInt8](repeating: 1, count: 13)]),
        ("oversize fragment", [[0, 0, 60] + [UInt8](repeating: 1, count: 14)]),
        ("duplicate fragment", [[0, 0, 60] + [UInt8](repeating: 1, count: 13), [1] + [UInt8](repeating: 1, count: 15), [1] + [UInt8](repeating: 1, count: 15)]),
        ("out of order", [[0, 0, 60] + [UInt8](repeating: 1, count: 13), [2] + [UInt8](repeating: 1, count: 15)]),
        ("continuation first", [[3, 1, 2, 3]]),
        ("reserved index", [[0x80, 1]]),
        ("channel only", [[]]),
        ("garbage envelope", [[0, 0, 5, 7, 7, 7, 7, 7]]),
    ])
    func malformedFramesAreRefusedAndTheBoxKeepsServing(_ attack: (String, [[UInt8]])) async throws {
        // Fragments the box holds (a continuation before its first fragment, a gap) or that the
        // radio refuses (oversize) end at the handshake timeout: 1 s here, not the default 5.
        let h = try await BoxHarness { $0.handshakeTimeout = .seconds(1) }
        try await h.run {
            var raw = try await AttackTests.RawPhone.connect(h, 0x40)
            try? await raw.write(attack.1.map { raw.channel.bytes + $0 })
            // The box answers a broken phone with a refusal (or nothing) and disconnects it.
            if let answer = await raw.receive() {
                guard case .refusal = try Envelope.decode(answer) else { Issue.record("\(attack.0): \(answer)"); return }
                #expect(await raw.expectDisconnect())
            }
            try await h.honestLogin()
        }
    }
}
