import Foundation
import Testing
@testable import BoxkeyCore

@Suite struct NoiseTests {
    let prologue = Fixtures.advertisement.prologue

    func handshake(boxKey: PublicKey = Fixtures.box.publicKey) throws -> (NoiseTransport, NoiseTransport) {
        var i = NoiseIKInitiator(prologue: prologue, localStatic: Fixtures.phone, remoteStatic: boxKey)
        var r = NoiseIKResponder(prologue: prologue, localStatic: Fixtures.box)
        let m1 = try i.writeMessage1()
        _ = try r.readMessage1(m1)
        let (m2, rt) = try r.writeMessage2()
        let (_, it) = try i.readMessage2(m2)
        return (it, rt)
    }

    @Test func messageSizesAreTheNamedConstants() throws {
        var i = NoiseIKInitiator(prologue: prologue, localStatic: Fixtures.phone, remoteStatic: Fixtures.box.publicKey)
        var r = NoiseIKResponder(prologue: prologue, localStatic: Fixtures.box)
        let m1 = try i.writeMessage1()
        #expect(m1.count == NoiseIK.message1Length)
        #expect(m1.count == 96)
        _ = try r.readMessage1(m1)
        #expect(r.remoteStatic == Fixtures.phone.publicKey)
        let (m2, _) = try r.writeMessage2()
        #expect(m2.count == NoiseIK.message2Length)
        #expect(m2.count == 48)
    }

    @Test func transportRoundTripsBothWays() throws {
        var (phone, box) = try handshake()
        let c = try phone.seal(SecureBytes(utf8: "hello box"))
        #expect(try box.open(c).unprotectedCopy == Array("hello box".utf8))
        let d = try box.seal(SecureBytes(utf8: "hello phone"))
        #expect(try phone.open(d).unprotectedCopy == Array("hello phone".utf8))
        #expect(phone.handshakeHash == box.handshakeHash)
    }

    @Test func wrongBoxKeyFailsAtTheBox() throws {
        let impostor = KeyPair.generate()
        var i = NoiseIKInitiator(prologue: prologue, localStatic: Fixtures.phone, remoteStatic: impostor.publicKey)
        var r = NoiseIKResponder(prologue: prologue, localStatic: Fixtures.box)
        let m1 = try i.writeMessage1()
        #expect(throws: NoiseError.decryptFailed) { try r.readMessage1(m1) }
    }

    @Test func differentPrologueFails() throws {
        var i = NoiseIKInitiator(prologue: prologue, localStatic: Fixtures.phone, remoteStatic: Fixtures.box.publicKey)
        var stale = Fixtures.advertisement
        stale.nonce &+= 1
        var r = NoiseIKResponder(prologue: stale.prologue, localStatic: Fixtures.box)
        #expect(throws: NoiseError.decryptFailed) { try r.readMessage1(try i.writeMessage1()) }
    }

    @Test func tamperedMessagesFail() throws {
        var i = NoiseIKInitiator(prologue: prologue, localStatic: Fixtures.phone, remoteStatic: Fixtures.box.publicKey)
        var m1 = try i.writeMessage1()
        m1[40] ^= 0x80
        var r = NoiseIKResponder(prologue: prologue, localStatic: Fixtures.box)
        #expect(throws: NoiseError.decryptFailed) { try r.readMessage1(m1) }

        var (phone, box) = try handshake()
        var c = try phone.seal(SecureBytes(utf8: "secret"))
        c[c.count - 1] ^= 1
        #expect(throws: NoiseError.decryptFailed) { try box.open(c) }
    }

    @Test func replayedTransportMessageFails() throws {
        var (phone, box) = try handshake()
        let c = try phone.seal(SecureBytes(utf8: "once"))
        _ = try box.open(c)
        #expect(throws: NoiseError.decryptFailed) { try box.open(c) }
        // The failed replay did not desynchronise the channel.
        let next = try phone.seal(SecureBytes(utf8: "twice"))
        #expect(try box.open(next).unprotectedCopy == Array("twice".utf8))
    }

    @Test func transportMessageFromAnotherSessionFails() throws {
        var (phone1, _) = try handshake()
        var (_, box2) = try handshake()
        let c = try phone1.seal(SecureBytes(utf8: "creds"))
        #expect(throws: NoiseError.decryptFailed) { try box2.open(c) }
    }

    @Test func rekeyHappensInStepOnBothSides() throws {
        var (phone, box) = try handshake()
        let start = NoiseTransport.rekeyInterval - 2
        phone.setNonces(send: start, receive: 0)
        box.setNonces(send: 0, receive: start)
        for i in 0..<5 {
            let c = try phone.seal(SecureBytes(utf8: "m\(i)"))
            #expect(try box.open(c).unprotectedCopy == Array("m\(i)".utf8))
        }
        #expect(box.receiveNonce == NoiseTransport.rekeyInterval + 3)
    }

    @Test func rekeyChangesTheKey() throws {
        // Same nonce, different key generation: the ciphertexts must differ.
        var (phone, _) = try handshake()
        phone.setNonces(send: NoiseTransport.rekeyInterval - 1, receive: 0)
        _ = try phone.seal(SecureBytes(utf8: "x"))         // nonce 2^16-1, then rekey
        var (phone2, _) = try handshake()
        phone2.setNonces(send: NoiseTransport.rekeyInterval, receive: 0)
        let a = try phone.seal(SecureBytes(utf8: "same"))
        let b = try phone2.seal(SecureBytes(utf8: "same"))
        #expect(a != b)
    }

    @Test func nonceExhaustionEndsTheChannel() throws {
        var (phone, _) = try handshake()
        phone.setNonces(send: CipherState.maxNonce, receive: 0)
        #expect(throws: NoiseError.nonceExhausted) { try phone.seal(SecureBytes(utf8: "x")) }
    }

    @Test func handshakeStepsCannotRepeat() throws {
        var i = NoiseIKInitiator(prologue: prologue, localStatic: Fixtures.phone, remoteStatic: Fixtures.box.publicKey)
        _ = try i.writeMessage1()
        #expect(throws: NoiseError.wrongHandshakeStep) { try i.writeMessage1() }
        var r = NoiseIKResponder(prologue: prologue, localStatic: Fixtures.box)
        #expect(throws: NoiseError.wrongHandshakeStep) { try r.writeMessage2() }
    }

    @Test func shortMessagesAreRejected() throws {
        var r = NoiseIKResponder(prologue: prologue, localStatic: Fixtures.box)
        #expect(throws: NoiseError.badMessageLength(expected: 96, actual: 95)) { try r.readMessage1([UInt8](repeating: 9, count: 95)) }
    }
}

/// Interop with `noiseprotocol` (PyPI), an implementation that shares no code with ours.
@Suite(.serialized) struct NoiseInteropTests {
    static let script = packageRoot.appendingPathComponent("Tests/BoxkeyCoreTests/Interop/noise_peer.py").path

    func python() throws -> String {
        guard let p = interopPython() else {
            throw TestFailure("no Python with noiseprotocol: run scripts/test (creates .venv) or set BOXKEY_PYTHON")
        }
        return p
    }

    var config: [String: String] {
        ["prologue": hex(Fixtures.advertisement.prologue),
         "phone_static": hex(Fixtures.phone.privateKey.unprotectedCopy),
         "box_static": hex(Fixtures.box.privateKey.unprotectedCopy),
         "box_public": hex(Fixtures.box.publicKey.bytes),
         "phone_ephemeral": hex([UInt8](repeating: 0x33, count: 32)),
         "box_ephemeral": hex([UInt8](repeating: 0x44, count: 32)),
         "phone_payload": hex(Array("user=alice".utf8)),
         "box_payload": hex(Array("accepted".utf8))]
    }

    func json(_ d: [String: String]) -> String {
        String(data: try! JSONSerialization.data(withJSONObject: d, options: [.sortedKeys]), encoding: .utf8)!
    }

    @Test func fixedKeysGiveIdenticalBytes() throws {
        let cfg = config
        let peer = try LinePeer(try python(), [Self.script, "vectors", json(cfg)])
        let line = peer.readLine()
        #expect(peer.finish() == 0)
        let theirs = try JSONSerialization.jsonObject(with: Data(line.utf8)) as! [String: String]

        var i = NoiseIKInitiator(prologue: unhex(cfg["prologue"]!)!, localStatic: Fixtures.phone,
                                 remoteStatic: Fixtures.box.publicKey, ephemeral: Fixtures.keyPair(0x33))
        var r = NoiseIKResponder(prologue: unhex(cfg["prologue"]!)!, localStatic: Fixtures.box, ephemeral: Fixtures.keyPair(0x44))
        let m1 = try i.writeMessage1()
        _ = try r.readMessage1(m1)
        let (m2, rt) = try r.writeMessage2()
        var box = rt
        var (_, phone) = try i.readMessage2(m2)
        let t1 = try phone.seal(SecureBytes(copying: unhex(cfg["phone_payload"]!)!))
        let t2 = try box.seal(SecureBytes(copying: unhex(cfg["box_payload"]!)!))

        #expect(hex(m1) == theirs["m1"])
        #expect(hex(m2) == theirs["m2"])
        #expect(hex(t1) == theirs["t1"])
        #expect(hex(t2) == theirs["t2"])
        #expect(hex(phone.handshakeHash) == theirs["hash"])
    }

    /// IKpsk2 (pairing): the same comparison with a PSK, byte for byte.
    @Test func pairingHandshakeWithAPSKGivesIdenticalBytes() throws {
        var cfg = config
        let psk = [UInt8](repeating: 0x5a, count: 32)
        cfg["psk"] = hex(psk)
        let peer = try LinePeer(try python(), [Self.script, "vectors", json(cfg)])
        let line = peer.readLine()
        #expect(peer.finish() == 0)
        let theirs = try JSONSerialization.jsonObject(with: Data(line.utf8)) as! [String: String]
        var i = NoiseIKInitiator(prologue: unhex(cfg["prologue"]!)!, localStatic: Fixtures.phone,
                                 remoteStatic: Fixtures.box.publicKey, ephemeral: Fixtures.keyPair(0x33), psk: true)
        var r = NoiseIKResponder(prologue: unhex(cfg["prologue"]!)!, localStatic: Fixtures.box, ephemeral: Fixtures.keyPair(0x44), psk: true)
        let m1 = try i.writeMessage1()
        _ = try r.readMessage1(m1)
        let (m2, _) = try r.writeMessage2(psk: SecureBytes(copying: psk))
        var (_, phone) = try i.readMessage2(m2, psk: SecureBytes(copying: psk))
        let t1 = try phone.seal(SecureBytes(copying: unhex(cfg["phone_payload"]!)!))
        #expect(hex(m1) == theirs["m1"])
        #expect(hex(m2) == theirs["m2"])
        #expect(hex(t1) == theirs["t1"])
        #expect(hex(phone.handshakeHash) == theirs["hash"])
    }

    @Test func swiftInitiatorWithPythonResponder() throws {
        let cfg = config
        let peer = try LinePeer(try python(), [Self.script, "responder", json(cfg)])
        var i = NoiseIKInitiator(prologue: Fixtures.advertisement.prologue, localStatic: Fixtures.phone, remoteStatic: Fixtures.box.publicKey)
        peer.send(hex(try i.writeMessage1()))
        var (_, channel) = try i.readMessage2(unhex(peer.readLine())!)
        peer.send(hex(try channel.seal(SecureBytes(utf8: "user=alice"))))
        #expect(peer.readLine() == hex(Array("user=alice".utf8)))
        #expect(try channel.open(unhex(peer.readLine())!).unprotectedCopy == Array("accepted".utf8))
        #expect(peer.finish() == 0)
    }

    @Test func pythonInitiatorWithSwiftResponder() throws {
        let cfg = config
        let peer = try LinePeer(try python(), [Self.script, "initiator", json(cfg)])
        var r = NoiseIKResponder(prologue: Fixtures.advertisement.prologue, localStatic: Fixtures.box)
        _ = try r.readMessage1(unhex(peer.readLine())!)
        #expect(r.remoteStatic == Fixtures.phone.publicKey)
        var (m2, channel) = try r.writeMessage2()
        peer.send(hex(m2))
        #expect(try channel.open(unhex(peer.readLine())!).unprotectedCopy == Array("user=alice".utf8))
        peer.send(hex(try channel.seal(SecureBytes(utf8: "accepted"))))
        #expect(peer.readLine() == hex(Array("accepted".utf8)))
        #expect(peer.finish() == 0)
    }
}
