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

/// The admin socket's messages: their own, so neither socket's decoder takes the other's.
@Suite struct AdminWireTests {
    static let requests: [AdminRequest] = [
        .listPhones, .revokePhone(fingerprint: "ab12"), .daemonStatus, .newPairingCode(user: ""), .newPairingCode(user: "alice"),
        .enrolPhone(key: String(repeating: "ab", count: 32), user: "alice", name: "pixel"), .reload,
    ]

    @Test func everyRequestAndReplyRoundTrips() throws {
        for request in Self.requests { #expect(try AdminRequest.decode(Array(request.encode().dropFirst(2))) == request) }
        for reply in [AdminReply.text("phones:\nalice"), .text(""), .text(String(repeating: "x", count: 1500)), .error("no such user: bob")] {
            var reader = AdminReply.Reader()
            #expect(try reader.read(Array(reply.encode().dropFirst(2))) == reply)
        }
    }

    /// An error quoting something long, multi-byte or with a newline still arrives, as whole
    /// characters and without control characters (before, it was cut mid-character or refused,
    /// and the admin command said the daemon was not answering).
    @Test func anErrorOfAnyTextArrives() throws {
        let why = "cannot read /etc/boxkey/boxkeyd.conf:\n" + String(repeating: "ж", count: 200)
        var reader = AdminReply.Reader()
        guard case .error(let got)? = try reader.read(Array(AdminReply.error(why).encode().dropFirst(2))) else { Issue.record("not an error"); return }
        #expect(got.utf8.count <= 255 && got.hasPrefix("cannot read /etc/boxkey/boxkeyd.conf: жж") && !got.contains("\n"))
        #expect(try PAMReply.decode(Array(PAMReply.notOffered("tab\there").encode().dropFirst(2))) == .notOffered("tab here"))
    }

    /// A list longer than a frame (a box with many phones) arrives whole, in parts cut between
    /// characters; a reader stops at the total cap.
    @Test func longOutputGoesInPartsAndComesBackWhole() throws {
        let long = String(repeating: "жанна ✓ alice\n", count: 700)   // ~12 KB, multi-byte characters
        var frames = AdminReply.text(long).encode()[...]
        var reader = AdminReply.Reader()
        var got: AdminReply?
        var count = 0
        while got == nil, frames.count >= 2 {
            let length = Int(frames[frames.startIndex]) << 8 | Int(frames[frames.startIndex + 1])
            #expect(length <= PAMWire.maxFrameLength)
            let body = Array(frames.dropFirst(2).prefix(length))
            frames = frames.dropFirst(2 + length)
            got = try reader.read(body)
            count += 1
        }
        #expect(got == .text(long) && frames.isEmpty && count > 5)
        var capped = AdminReply.Reader()
        let part = Array(AdminReply.text(String(repeating: "x", count: 5000)).encode().dropFirst(2).prefix(2048))
        #expect(throws: PAMWire.DecodeError.self) { for _ in 0...(AdminReply.maxTextBytes / 2044) { _ = try capped.read(part) } }
    }

    @Test func neitherSocketDecodesTheOthersRequests() throws {
        for request in Self.requests {
            let body = Array(request.encode().dropFirst(2))
            #expect(throws: PAMWire.DecodeError.unknownType(body[1])) { try PAMRequest.decode(body) }
            #expect(AdminRequest.name(ofType: body[1]) != nil && PAMRequest.name(ofType: body[1]) == nil)
        }
        let prompts: [PAMRequest] = [.waitForPush(.init(service: "login", tty: "tty1", display: "", expectedUser: "", timeoutMilliseconds: 1000)),
                                     .cancel, .intent, .reportOutcome(.accepted, reason: ""), .capturedPassword([0x61]),
                                     .openSession(user: "a", sessionID: "1", service: "login", ticket: ""), .closeSession(sessionID: "1")]
        for request in prompts {
            let body = Array(request.encode().dropFirst(2))
            #expect(throws: PAMWire.DecodeError.unknownType(body[1])) { try AdminRequest.decode(body) }
            #expect(PAMRequest.name(ofType: body[1]) != nil && AdminRequest.name(ofType: body[1]) == nil)
        }
        // The module never hears admin output: 0x86 is no PAM reply.
        #expect(throws: PAMWire.DecodeError.unknownType(0x86)) { try PAMReply.decode(Array(AdminReply.text("x").encode().dropFirst(2))) }
        var reader = AdminReply.Reader()
        #expect(throws: PAMWire.DecodeError.self) { try reader.read(Array(PAMReply.ok.encode().dropFirst(2))) }
    }
}
