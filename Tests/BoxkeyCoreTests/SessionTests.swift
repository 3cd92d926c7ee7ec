import Testing
@testable import BoxkeyCore

@Suite struct SessionStateTableTests {
    typealias T = AppMessage.MessageType

    @Test func boxAcceptsOnePushPerHandshake() {
        #expect(BoxSessionState.awaitingCommand.next(onPhone: .credentialPush) == .verifying)
        for s: BoxSessionState in [.awaitingHandshake, .verifying, .present, .acting(.lock), .closed] {
            #expect(s.next(onPhone: .credentialPush) == nil, "push must be illegal while \(s)")
        }
        #expect(BoxSessionState.verifying.next(onLoginResult: .rejected) == .closed)
        #expect(BoxSessionState.verifying.next(onLoginResult: .accepted) == .present)
        #expect(BoxSessionState.present.next(onLoginResult: .accepted) == nil)
    }

    @Test func boxNeverAcceptsBoxToPhoneMessages() {
        for s: BoxSessionState in [.awaitingHandshake, .awaitingCommand, .verifying, .present, .acting(.attach)] {
            #expect(s.next(onPhone: .loginResult) == nil)
            #expect(s.next(onPhone: .actionResult) == nil)
        }
    }

    @Test func boxPresenceAndActions() {
        #expect(BoxSessionState.present.next(onPhone: .keepalive) == .present)
        #expect(BoxSessionState.awaitingCommand.next(onPhone: .keepalive) == nil)
        #expect(BoxSessionState.present.next(onPhone: .lock) == .acting(.lock, guarding: true))
        #expect(BoxSessionState.awaitingCommand.next(onPhone: .lock) == .acting(.lock))
        #expect(BoxSessionState.present.next(onPhone: .attach) == nil)
        #expect(BoxSessionState.acting(.attach).next(onActionResult: ActionResult(action: .attach, outcome: .done)) == .present)
        #expect(BoxSessionState.acting(.attach).next(onActionResult: ActionResult(action: .attach, outcome: .noSession)) == .closed)
        #expect(BoxSessionState.acting(.lock).next(onActionResult: ActionResult(action: .lock, outcome: .done)) == .closed)
        #expect(BoxSessionState.acting(.lock).next(onActionResult: ActionResult(action: .logout, outcome: .done)) == nil)
        // On the presence link, a lock or logout that did not happen leaves the link guarding.
        #expect(BoxSessionState.acting(.lock, guarding: true).next(onActionResult: ActionResult(action: .lock, outcome: .done)) == .closed)
        #expect(BoxSessionState.acting(.lock, guarding: true).next(onActionResult: ActionResult(action: .lock, outcome: .notLockable)) == .present)
        #expect(BoxSessionState.acting(.logout, guarding: true).next(onActionResult: ActionResult(action: .logout, outcome: .failed)) == .present)
        #expect(BoxSessionState.acting(.lock).next(onActionResult: ActionResult(action: .lock, outcome: .notLockable)) == .closed)
        #expect(BoxSessionState.verifying.next(onPhone: .error) == .closed)
        #expect(BoxSessionState.present.next(onPhone: .detach) == .closed)
        #expect(BoxSessionState.awaitingCommand.next(onPhone: .detach) == nil)
    }

    @Test func phoneSendsOnlyWhatItsStateAllows() {
        #expect(PhoneSessionState.ready.next(onSend: .credentialPush) == .awaitingLoginResult)
        #expect(PhoneSessionState.present.next(onSend: .credentialPush) == nil)
        #expect(PhoneSessionState.idle.next(onSend: .lock) == nil)
        #expect(PhoneSessionState.present.next(onSend: .keepalive) == .present)
        #expect(PhoneSessionState.ready.next(onSend: .loginResult) == nil)
        #expect(PhoneSessionState.awaitingLoginResult.next(onBox: .loginResult(LoginResult(.accepted))) == .present)
        #expect(PhoneSessionState.awaitingLoginResult.next(onBox: .loginResult(LoginResult(.rejected))) == .closed)
        #expect(PhoneSessionState.ready.next(onBox: .loginResult(LoginResult(.accepted))) == nil)
        #expect(PhoneSessionState.awaitingActionResult(.lock).next(onBox: .actionResult(ActionResult(action: .logout, outcome: .done))) == nil)
        #expect(PhoneSessionState.present.next(onBox: .lock) == nil)
        #expect(PhoneSessionState.present.next(onSend: .lock) == .awaitingActionResult(.lock, guarding: true))
        // Ctrl-C: a push waiting for Enter is taken back; the box answers with the login's result.
        #expect(PhoneSessionState.awaitingLoginResult.next(onSend: .withdraw) == .awaitingLoginResult)
        #expect(PhoneSessionState.present.next(onSend: .withdraw) == nil)
        #expect(PhoneSessionState.awaitingLoginResult.next(onBox: .loginResult(LoginResult(.withdrawn))) == .closed)
        #expect(BoxSessionState.verifying.next(onPhone: .withdraw) == .verifying)
        #expect(BoxSessionState.awaitingCommand.next(onPhone: .withdraw) == nil)
        #expect(BoxSessionState.present.next(onPhone: .withdraw) == nil)
        #expect(PhoneSessionState.awaitingActionResult(.lock, guarding: true).next(onBox: .actionResult(ActionResult(action: .lock, outcome: .notLockable))) == .present)
        #expect(PhoneSessionState.awaitingActionResult(.lock).next(onBox: .actionResult(ActionResult(action: .lock, outcome: .notLockable))) == .closed)
    }
}

@Suite struct ConnectionTests {
    @Test func loginAcceptedThenPresence() throws {
        var x = Exchange()
        try x.open()
        #expect(x.box.phoneKey == Fixtures.phone.publicKey)
        #expect(x.box.state == .awaitingCommand)
        let (out, events) = x.toBox(try x.phone.send(.credentialPush(Fixtures.push())))
        #expect(events.isEmpty)
        guard case .login(let push) = out.request else { Issue.record("expected login request"); return }
        #expect(push.user == "alice" && push.deviceName == "pixel")
        #expect(push.password.isEqual(to: SecureBytes(utf8: "correct horse")))
        #expect(x.box.state == .verifying)

        let verdict = x.deliver(x.box.finishLogin(LoginResult(.accepted)).replies)
        #expect(verdict.count == 1)
        #expect(try verdict[0].get() == .loginResult(LoginResult(.accepted)))
        #expect(x.phone.state == .present && x.box.state == .present)

        let (_, pong) = x.toBox(try x.phone.send(.keepalive))
        #expect(try pong[0].get() == .keepalive)
    }

    /// Proximity: the offer carries no secret, and the phone may push only after the box said
    /// the person asked (Enter at the prompt); a push before that is illegal on both sides.
    @Test func anOfferWaitsForTheIntentThenOnePush() throws {
        var x = Exchange()
        try x.open()
        let (out, _) = x.toBox(try x.phone.send(.offer(ProximityOffer(user: "alice", deviceName: "pixel"))))
        guard case .offer(let offer) = out.request else { Issue.record("expected an offer: \(String(describing: out.request))"); return }
        #expect(offer.user == "alice" && x.box.state == .offering && x.phone.state == .awaitingIntent)
        #expect(throws: PhoneConnection.Error.self) { try x.phone.send(.credentialPush(Fixtures.push())) }
        #expect(x.box.nextDeadline == nil)  // the person's time, bounded by the prompt at the box
        let intent = x.deliver(x.box.giveIntent(now: .seconds(1)).replies)
        #expect(try intent[0].get() == .intent)
        #expect(x.phone.state == .ready && x.box.state == .awaitingCommand && x.box.nextDeadline == .seconds(1) + x.box.commandTimeout)
        let (push, _) = x.toBox(try x.phone.send(.credentialPush(Fixtures.push())))
        guard case .login = push.request else { Issue.record("expected the push"); return }
        #expect(x.box.giveIntent(now: .seconds(2)).replies.isEmpty)  // no second intent
    }

    @Test func aRefusedOfferClosesAndAnEarlyPushIsAViolation() throws {
        var x = Exchange()
        try x.open()
        _ = x.toBox(try x.phone.send(.offer(ProximityOffer(user: "alice", deviceName: ""))))
        let refused = x.deliver(x.box.finishLogin(LoginResult(.notAtPrompt, reason: "gone")).replies)
        #expect(try refused[0].get() == .loginResult(LoginResult(.notAtPrompt, reason: "gone")))
        #expect(x.phone.state == .closed && x.box.state == .closed)

        var y = Exchange()
        try y.open()
        _ = y.toBox(try y.phone.send(.offer(ProximityOffer(user: "alice", deviceName: ""))))
        let (out, _) = y.toBox(try y.phone.sealIgnoringState(.credentialPush(Fixtures.push())))
        guard case .close(.protocolViolation) = out.request else { Issue.record("a push before the intent: \(String(describing: out.request))"); return }
        #expect(y.box.finishLogin(LoginResult(.accepted)).replies.isEmpty)
    }

    @Test func rejectedPushClosesAndASecondPushIsRefused() throws {
        var x = Exchange()
        try x.open()
        _ = x.toBox(try x.phone.send(.credentialPush(Fixtures.push(password: "wrong"))))
        // While verifying, the phone cannot send another push.
        #expect(throws: PhoneConnection.Error.self) { try x.phone.send(.credentialPush(Fixtures.push())) }
        let out = x.box.finishLogin(LoginResult(.rejected, reason: "Authentication failure"))
        guard case .close(.finished) = out.request else { Issue.record("box must close after a rejection"); return }
        let events = x.deliver(out.replies)
        #expect(try events[0].get() == .loginResult(LoginResult(.rejected, reason: "Authentication failure")))
        #expect(x.phone.state == .closed && x.box.state == .closed)
    }

    @Test func boxRefusesASecondPushOnTheSameChannel() throws {
        // A modified phone that ignores its own state table: valid ciphertexts, illegal order.
        var x = Exchange()
        try x.open()
        _ = x.toBox(try x.phone.sealIgnoringState(.credentialPush(Fixtures.push())))
        #expect(x.box.state == .verifying)
        let (out, events) = x.toBox(try x.phone.sealIgnoringState(.credentialPush(Fixtures.push())))
        guard case .close(.protocolViolation(let why)) = out.request else { Issue.record("\(String(describing: out.request))"); return }
        #expect(why.contains("not legal"))
        #expect(x.box.state == .closed)
        guard case .failure(.boxError(let e)) = events[0] else { Issue.record("phone not told: \(events)"); return }
        #expect(e.code == .unexpectedMessage)
    }

    @Test func boxRefusesMessagesOnlyItMaySend() throws {
        var x = Exchange()
        try x.open()
        let (out, _) = x.toBox(try x.phone.sealIgnoringState(.loginResult(LoginResult(.accepted))))
        guard case .close(.protocolViolation) = out.request else { Issue.record("\(String(describing: out.request))"); return }
    }

    @Test func recordedCredentialMessageCannotBeReplayed() throws {
        var x = Exchange()
        try x.open()
        let recorded = try x.phone.send(.credentialPush(Fixtures.push()))
        _ = x.toBox(recorded)
        _ = x.box.finishLogin(LoginResult(.accepted))
        // Same channel: the nonce has moved on.
        let (out1, _) = x.toBox(recorded)
        guard case .close(.protocolViolation) = out1.request else { Issue.record("replay on same channel accepted"); return }
        // A fresh session: different keys.
        var y = Exchange()
        try y.open()
        let (out2, _) = y.toBox(recorded)
        guard case .close(.protocolViolation) = out2.request else { Issue.record("replay on new channel accepted"); return }
        #expect(y.box.state == .closed)
    }

    /// A phone that heard no answer sends message 1 again on its link: the box answers with
    /// the same bytes (no new handshake, no replay-cache entry), at most twice, and only until
    /// the phone's first sealed message. The phone opens on the first answer it hears.
    @Test func messageOneSentAgainOnTheSameLinkGetsTheSameAnswer() throws {
        var x = Exchange()
        let m1 = try x.phone.start()
        let first = x.box.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, admit: x.admit)
        #expect(first.replies.count == 1 && !first.repeatedAnswer)
        let cached = x.cache.count
        for _ in 0..<BoxConnection.maxRepeatedAnswers {
            let again = x.box.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, admit: x.admit)
            #expect(again.replies == first.replies && again.repeatedAnswer && again.request == nil)
        }
        #expect(x.cache.count == cached && x.box.state == .awaitingCommand)
        // The first answer "lost": the phone opens on a repeated one, which is the same.
        guard case .success(.channelOpen) = x.deliver(first.replies)[0] else { Issue.record("phone did not open"); return }
        // A third time is too many: the link ends.
        let tooMany = x.box.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, admit: x.admit)
        guard case .close(.protocolViolation) = tooMany.request else { Issue.record("\(String(describing: tooMany.request))"); return }
    }

    /// Once the phone has spoken on the channel, message 1 is a replay like any other.
    @Test func messageOneAfterTheFirstSealedMessageIsNotAnswered() throws {
        var x = Exchange()
        let m1 = try x.open()
        _ = x.toBox(try x.phone.send(.credentialPush(CredentialPush(user: "alice", password: SecureBytes(utf8: "pw"), deviceName: "test"))))
        let again = x.box.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, admit: x.admit)
        #expect(!again.repeatedAnswer)
        guard case .close(.protocolViolation) = again.request else { Issue.record("\(String(describing: again.request))"); return }
    }

    /// A pairing's message 1 sent again costs the code no second try.
    @Test func aRepeatedPairingMessageOneIsNoSecondTry() throws {
        let code = PairingCode("123456")!
        var x = Exchange(phoneCode: code, boxCode: code)
        let m1 = try x.phone.start()
        let first = x.box.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, pairingCode: code, admit: x.admit)
        guard case .pairingAttempt? = first.request else { Issue.record("\(String(describing: first.request))"); return }
        let again = x.box.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, pairingCode: code, admit: x.admit)
        #expect(again.replies == first.replies && again.request == nil)
    }

    @Test func recordedFirstMessageIsRefused() throws {
        var x = Exchange()
        let m1 = try x.open()
        var replayBox = BoxConnection(identity: Fixtures.box, boxID: Fixtures.boxID, connectedAt: .zero)
        let out = replayBox.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, admit: { _, _ in nil })
        #expect(out.replies == [Envelope.refusal(Refusal(.replayedHandshake)).encode()])
        // After the nonce rotates out, the same message is refused as stale.
        x.nonces.rotate(); x.nonces.rotate()
        x.cache.retain(nonces: x.nonces.live)
        var later = BoxConnection(identity: Fixtures.box, boxID: Fixtures.boxID, connectedAt: .zero)
        let out2 = later.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, admit: { _, _ in nil })
        #expect(out2.replies == [Envelope.refusal(Refusal(.staleAdvertisement)).encode()])
    }

    /// An enrolled insider opening handshake after handshake fills the cache. Once it was
    /// full, every phone was refused `rateLimited` until the nonce rotated; now the flooding
    /// key forgets its own oldest, and alice's recorded message 1 stays a replay.
    @Test func aKeyThatFloodsTheReplayCacheAgesOutOnlyItsOwnHandshakes() throws {
        var x = Exchange()
        x.cache = HandshakeReplayCache(capacity: 8)
        let alices = try x.open()
        let mallory = KeyPair.generate()
        var firstOfMallorys: [UInt8] = []
        for i in 0..<20 {
            var phone = PhoneConnection(identity: mallory, boxKey: Fixtures.box.publicKey, advertisement: Fixtures.advertisement)
            let m1 = try phone.start()
            if i == 0 { firstOfMallorys = m1 }
            var box = BoxConnection(identity: Fixtures.box, boxID: Fixtures.boxID, connectedAt: .zero)
            let out = box.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, admit: { _, _ in nil })
            #expect(box.state == .awaitingCommand, "handshake \(i): \(out.replies)")
        }
        #expect(x.cache.count == 8)
        func replayed(_ m1: [UInt8]) -> Bool {
            var box = BoxConnection(identity: Fixtures.box, boxID: Fixtures.boxID, connectedAt: .zero)
            return box.receive(m1, nonces: x.nonces, replayCache: &x.cache, now: .zero, admit: { _, _ in nil }).replies
                == [Envelope.refusal(Refusal(.replayedHandshake)).encode()]
        }
        #expect(replayed(alices))
        #expect(!replayed(firstOfMallorys))  // forgotten: mallory's own, and it costs only mallory's slot
        // And alice still gets in.
        var again = Exchange()
        again.cache = x.cache
        _ = try again.open()
    }

    /// Many keys with one handshake each (an insider's keys, or a pairing code's tries): of keys
    /// holding equally many, the one heard from last forgets, so alice's stays a replay.
    @Test func aFloodOfKeysAgesOutItsOwnHandshakes() {
        var cache = HandshakeReplayCache(capacity: 4)
        let alice = KeyPair.generate().publicKey, alices = KeyPair.generate().publicKey
        #expect(cache.insert(alices, nonce: 1, phone: alice) == .fresh)
        for _ in 0..<10 {
            #expect(cache.insert(KeyPair.generate().publicKey, nonce: 1, phone: KeyPair.generate().publicKey) == .fresh)
        }
        #expect(cache.count == 4)
        #expect(cache.insert(alices, nonce: 1, phone: alice) == .replayed)
    }

    /// A flood across a nonce rotation: the bound holds, the flooding key forgets its own, and
    /// what the rotation drops leaves the count right.
    @Test func aFloodAcrossANonceRotationKeepsTheBoundAndAlicesHandshake() {
        var cache = HandshakeReplayCache(capacity: 4)
        let mallory = KeyPair.generate().publicKey, alice = KeyPair.generate().publicKey
        let old = (0..<4).map { _ in KeyPair.generate().publicKey }
        for e in old { #expect(cache.insert(e, nonce: 1, phone: mallory) == .fresh) }
        cache.retain(nonces: [1, 2])
        #expect(cache.count == 4)
        let alices = KeyPair.generate().publicKey
        #expect(cache.insert(alices, nonce: 2, phone: alice) == .fresh)
        for _ in 0..<3 { #expect(cache.insert(KeyPair.generate().publicKey, nonce: 2, phone: mallory) == .fresh) }
        #expect(cache.count == 4)
        #expect(cache.insert(old[0], nonce: 1, phone: mallory) == .fresh)  // forgotten, mallory's own
        cache.retain(nonces: [2])
        #expect(cache.count == 3)
        #expect(cache.insert(alices, nonce: 2, phone: alice) == .replayed)
    }

    @Test func wrongBoxKeyIsRefusedAndThePhoneCannotOpen() throws {
        var x = Exchange(boxKey: KeyPair.generate().publicKey)
        let (out, events) = x.toBox(try x.phone.start())
        guard case .close(.refused(.handshakeFailed)) = out.request else { Issue.record("\(String(describing: out.request))"); return }
        #expect(events.count == 1)
        guard case .failure(.refused(let r)) = events[0] else { Issue.record("\(events)"); return }
        #expect(r.code == .handshakeFailed)
    }

    @Test func phoneDetectsABoxWithoutThePinnedKey() throws {
        // An impostor box answers message 1 with its own message 2.
        var phone = PhoneConnection(identity: Fixtures.phone, boxKey: Fixtures.box.publicKey, advertisement: Fixtures.advertisement)
        _ = try phone.start()
        let bogus = Envelope.handshakeResponse(noise: KeyPair.generate().publicKey.bytes + [UInt8](repeating: 0, count: 16)).encode()
        #expect(throws: PhoneConnection.Error.boxAuthenticationFailed) { try phone.receive(bogus) }
    }

    @Test func staleAdvertisementNonceIsRefused() throws {
        var stale = Fixtures.advertisement
        stale.nonce = 0x1234
        var x = Exchange(advertisement: stale)
        let (out, _) = x.toBox(try x.phone.start())
        guard case .close(.refused(.staleAdvertisement)) = out.request else { Issue.record("\(String(describing: out.request))"); return }
    }

    @Test func tamperedCiphertextClosesTheChannel() throws {
        var x = Exchange()
        try x.open()
        var m = try x.phone.send(.credentialPush(Fixtures.push()))
        m[10] ^= 0x01
        let (out, _) = x.toBox(m)
        guard case .close(.protocolViolation) = out.request else { Issue.record("tampered message accepted"); return }
    }

    @Test func revokedPhoneIsRefused() throws {
        var x = Exchange()
        x.admit = { key, _ in key == Fixtures.phone.publicKey ? .phoneRevoked : nil }
        let (out, events) = x.toBox(try x.phone.start())
        guard case .close(.refused(.phoneRevoked)) = out.request else { Issue.record("\(String(describing: out.request))"); return }
        guard case .failure(.refused(let r)) = events[0] else { Issue.record("\(events)"); return }
        #expect(r.code == .phoneRevoked)
    }

    @Test func unknownVersionGetsARefusalNamingOurVersions() throws {
        var x = Exchange()
        var m1 = try x.phone.start()
        m1[0] = 9
        let (out, _) = x.toBox(m1)
        let v = BoxkeyProtocol.version
        #expect(out.replies == [[v, 4, 1, v, v]])
    }

    @Test func garbageBeforeHandshakeIsRefusedAsMalformed() {
        var x = Exchange()
        let (out, _) = x.toBox([BoxkeyProtocol.version, 3] + [UInt8](repeating: 0, count: 40))
        guard case .close(.refused(.malformed)) = out.request else { Issue.record("\(String(describing: out.request))"); return }
    }

    @Test func handshakeAndCommandTimeouts() throws {
        var slow = BoxConnection(identity: Fixtures.box, boxID: Fixtures.boxID, connectedAt: .seconds(100))
        #expect(slow.tick(now: .seconds(104)).request == nil)
        guard case .close(.timedOut) = slow.tick(now: .seconds(105)).request else { Issue.record("no handshake timeout"); return }

        var x = Exchange()
        try x.open()
        #expect(x.box.nextDeadline == BoxConnection.defaultCommandTimeout)
        let out = x.box.tick(now: .seconds(10))
        guard case .close(.timedOut) = out.request else { Issue.record("no command timeout"); return }
        guard case .failure(.boxError(let e)) = x.deliver(out.replies)[0] else { Issue.record("phone not told"); return }
        #expect(e.code == .unexpectedMessage)
    }

    @Test func lockAndAttach() throws {
        var x = Exchange()
        try x.open()
        let (out, _) = x.toBox(try x.phone.send(.attach))
        guard case .action(.attach) = out.request else { Issue.record("no attach request"); return }
        _ = x.deliver(x.box.finishAction(ActionResult(action: .attach, outcome: .done)).replies)
        #expect(x.phone.state == .present && x.box.state == .present)
        let (lockOut, _) = x.toBox(try x.phone.send(.lock))
        guard case .action(.lock) = lockOut.request else { Issue.record("no lock request"); return }
        let done = x.box.finishAction(ActionResult(action: .lock, outcome: .done))
        #expect(try x.deliver(done.replies)[0].get() == .actionResult(ActionResult(action: .lock, outcome: .done)))
        #expect(x.box.state == .closed && x.phone.state == .closed)
    }

    @Test func boxIgnoresLocalEventsThatDoNotFitItsState() throws {
        var x = Exchange()
        try x.open()
        #expect(x.box.finishLogin(LoginResult(.accepted)).replies.isEmpty)
        #expect(x.box.state == .awaitingCommand)
    }
}

@Suite struct WireSizeTests {
    /// The table in docs/protocol.md section 11.
    @Test func loginMessagesHaveTheDocumentedSizes() throws {
        var x = Exchange()
        let m1 = try x.phone.start()
        let (out, _) = x.toBox(m1)
        let push = try x.phone.send(.credentialPush(Fixtures.push(user: "alice", password: "correct horse", device: "pixel")))
        _ = x.toBox(push)
        let result = x.box.finishLogin(LoginResult(.accepted)).replies[0]
        let sizes = [m1.count, out.replies[0].count, push.count, result.count]
        #expect(sizes == [100, 50, 46, 21])
        #expect(sizes.map { Framing.fragmentCount(messageLength: $0, mtu: 23) } == [8, 4, 4, 2])
        let largest = Envelope.headerLength + CredentialPush.maxEncodedLength + NoiseIK.transportOverhead
        #expect(largest == 695 && Framing.fragmentCount(messageLength: largest, mtu: 23) == 54)
    }
}
