import BoxkeyPAMWire
import Testing

/// The daemon-to-module replies that decide a login: exact, and a key login names a user.
@Suite struct PAMWireTests {
    func decode(_ frame: [UInt8]) throws -> PAMReply { try PAMReply.decode(Array(frame.dropFirst(2))) }

    @Test func aKeyLoginRoundTripsAndCarriesNoPassword() throws {
        let reply = PAMReply.keyLogin(user: "alice", ticket: "t1")
        #expect(try decode(reply.encode()) == reply)
        #expect(try decode(PAMReply.push(user: "alice", password: Array("pw".utf8), ticket: "t1").encode()) != reply)
    }

    @Test func aKeyLoginForNobodyOrWithTrailingBytesIsRefused() {
        #expect(throws: PAMWire.DecodeError.invalidText) { try decode(PAMReply.keyLogin(user: "", ticket: "t").encode()) }
        #expect(throws: PAMWire.DecodeError.trailingBytes) { try PAMReply.decode(Array(PAMReply.keyLogin(user: "a", ticket: "t").encode().dropFirst(2)) + [0]) }
    }
}

@Suite struct EscrowWireTests {
    @Test func aCaptureAndItsPasswordRoundTripAndFollowTheConnectionStates() throws {
        let reply = PAMReply.escrowCapture(user: "alice", ticket: "t")
        #expect(try PAMReply.decode(Array(reply.encode().dropFirst(2))) == reply)
        let request = PAMRequest.capturedPassword(Array("typed".utf8))
        #expect(try PAMRequest.decode(Array(request.encode().dropFirst(2))) == request)
        #expect(throws: PAMWire.DecodeError.invalidText) { try PAMRequest.decode(Array(PAMRequest.capturedPassword([0x61, 0, 0x62]).encode().dropFirst(2))) }
        // Only after a push (or capture) went to this connection, and before its report.
        #expect(PAMConnectionState.fresh.next(on: request) == nil)
        #expect(PAMConnectionState.waiting.next(on: request) == nil)
        #expect(PAMConnectionState.pushed.next(on: request) == .pushed)
        #expect(PAMConnectionState.done.next(on: request) == nil)
    }
}

@Suite struct EnterWireTests {
    @Test func enterAndItsAnswersRoundTripAndEnterOnlyWhileThePromptIsOpen() throws {
        for reason in [PAMReply.NoPushReason.nothingYet, .timedOut, .superseded, .shuttingDown] {
            #expect(try PAMReply.decode(Array(PAMReply.noPush(reason).encode().dropFirst(2))) == .noPush(reason))
        }
        #expect(throws: PAMWire.DecodeError.invalidValue(4)) { try PAMReply.decode([PAMWire.version, 0x83, 4]) }
        // A module of the version before (it waited for the push before any prompt) is refused whole.
        #expect(throws: PAMWire.DecodeError.unsupportedVersion(2)) { try PAMRequest.decode([2, 0x08]) }
        #expect(try PAMRequest.decode(Array(PAMRequest.intent.encode().dropFirst(2))) == .intent)
        #expect(PAMConnectionState.waiting.next(on: .intent) == .waiting)
        for state in [PAMConnectionState.fresh, .pushed, .done] { #expect(state.next(on: .intent) == nil) }
    }
}
