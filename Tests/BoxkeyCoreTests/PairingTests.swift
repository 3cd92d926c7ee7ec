@testable import BoxkeyCore
import Testing

/// The pairing handshake: CPace on the code, keyed into Noise IKpsk2.
struct PairingTests {
    let code = PairingCode("482913")!

    @Test func cpaceAgreesOnlyOnTheSameCode() throws {
        let context = Array("ctx".utf8)
        let a = CPace.start(code: code.bytes, context: context)
        let b = CPace.start(code: code.bytes, context: context)
        let c = CPace.start(code: PairingCode("482914")!.bytes, context: context)
        let kab = try CPace.finish(a, peerShare: b.share, context: context, initiatorShare: a.share, responderShare: b.share)
        let kba = try CPace.finish(b, peerShare: a.share, context: context, initiatorShare: a.share, responderShare: b.share)
        let kcb = try CPace.finish(c, peerShare: b.share, context: context, initiatorShare: c.share, responderShare: b.share)
        let kbc = try CPace.finish(b, peerShare: c.share, context: context, initiatorShare: c.share, responderShare: b.share)
        #expect(kab.isEqual(to: kba))
        #expect(!kcb.isEqual(to: kbc))
        // Shares are fresh every run: nothing an eavesdropper sees repeats.
        #expect(a.share != b.share)
    }

    @Test func invalidSharesAreRejected() {
        let a = CPace.start(code: code.bytes, context: [])
        #expect(throws: CPace.Failure.invalidShare) {
            _ = try CPace.finish(a, peerShare: [UInt8](repeating: 0, count: 32), context: [], initiatorShare: a.share, responderShare: [])
        }
        #expect(throws: CPace.Failure.invalidShare) {
            _ = try CPace.finish(a, peerShare: [UInt8](repeating: 0xff, count: 32), context: [], initiatorShare: a.share, responderShare: [])
        }
    }

    @Test func codesAreSixDigitsAndTypedLoosely() {
        #expect(PairingCode("482 913")?.text == "482913")
        #expect(PairingCode("482-913")?.text == "482913")
        #expect(PairingCode("48291") == nil)
        #expect(PairingCode("48291x") == nil)
        #expect(PairingCode.random().text.count == 6)
    }

    @Test func theRightCodePairsAndOnlyPairConfirmIsLegal() throws {
        var x = Exchange(phoneCode: code, boxCode: code)
        let (out, events) = x.toBox(try x.phone.start())
        guard case .pairingAttempt(let key)? = out.request else { Issue.record("\(String(describing: out.request))"); return }
        #expect(key == Fixtures.phone.publicKey)
        guard case .success(.channelOpen) = events.first else { Issue.record("\(events)"); return }
        #expect(x.box.state == .awaitingPairConfirm)
        let (confirm, _) = x.toBox(try x.phone.send(.pair))
        guard case .action(.pair)? = confirm.request else { Issue.record("\(String(describing: confirm.request))"); return }
    }

    @Test func aPairingChannelCannotPush() throws {
        var x = Exchange(phoneCode: code, boxCode: code)
        _ = x.toBox(try x.phone.start())
        let push = try x.phone.sealIgnoringState(.credentialPush(Fixtures.push()))
        let (out, _) = x.toBox(push)
        guard case .close(.protocolViolation)? = out.request else { Issue.record("a push on a pairing channel: \(String(describing: out.request))"); return }
    }

    @Test func aWrongCodeFailsAtThePhoneAndNothingOpens() throws {
        var x = Exchange(phoneCode: PairingCode("000001")!, boxCode: code)
        let (out, events) = x.toBox(try x.phone.start())
        guard case .pairingAttempt? = out.request else { Issue.record("the try is counted: \(String(describing: out.request))"); return }
        guard case .failure(.pairingFailed) = events.first else { Issue.record("\(events)"); return }
    }

    @Test func aBoxWithoutALiveCodeRefuses() throws {
        var x = Exchange(phoneCode: code, boxCode: nil)
        let (out, events) = x.toBox(try x.phone.start())
        guard case .close(.refused(.noPairingCode))? = out.request else { Issue.record("\(String(describing: out.request))"); return }
        guard case .failure(.refused(let r)) = events.first else { Issue.record("\(events)"); return }
        #expect(r.code == .noPairingCode)
    }

    /// A fake box (any key, read from a spoofed Info) cannot answer a pairing phone without the
    /// code: the phone's message 2 fails, so the code also verifies the box key.
    @Test func aFakeBoxWithoutTheCodeFails() throws {
        var x = Exchange(boxKey: Fixtures.box.publicKey, phoneCode: code, boxCode: PairingCode("999999")!)
        let (_, events) = x.toBox(try x.phone.start())
        guard case .failure(.pairingFailed) = events.first else { Issue.record("\(events)"); return }
    }

    @Test func unknownKeysAreRefusedBeforeTheReplayCache() throws {
        var x = Exchange()
        x.admit = { _, kind in kind == .login ? .notEnrolled : nil }
        let (out, events) = x.toBox(try x.phone.start())
        guard case .close(.refused(.notEnrolled))? = out.request else { Issue.record("\(String(describing: out.request))"); return }
        guard case .failure(.refused(let r)) = events.first else { Issue.record("\(events)"); return }
        #expect(r.code == .notEnrolled)
        #expect(x.cache.count == 0)
    }

    @Test func logSafeEscapesLineAndDirectionControls() {
        #expect(logSafe("alice\u{2028}login accepted user root") == "alice\\u{2028}login accepted user root")
        #expect(logSafe("a\u{202E}b\u{2066}c\nd\\") == "a\\u{202E}b\\u{2066}c\\u{A}d\\u{5C}")
        #expect(logSafe("Zoë's Pixel") == "Zoë's Pixel")
    }
}
