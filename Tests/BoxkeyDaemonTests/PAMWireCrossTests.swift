import BoxkeyPAMWire
import Testing
import pam_boxkey

/// The module (C, Sources/pam_boxkey/wire.c) and the daemon (BoxkeyPAMWire) each have their
/// side of the wire: what one writes, the other reads as meant, and what the daemon's decoder
/// refuses, the module's refuses too.
@Suite struct PAMWireCrossTests {
    /// The C frame's bytes, length prefix included.
    func bytes(_ encode: (UnsafeMutablePointer<bk_frame>) -> Void) -> [UInt8] {
        let frame = UnsafeMutablePointer<bk_frame>.allocate(capacity: 1)
        defer { frame.deallocate() }
        encode(frame)
        return withUnsafeBytes(of: frame.pointee.bytes) { Array($0.prefix(frame.pointee.length)) }
    }

    func request(_ encode: (UnsafeMutablePointer<bk_frame>) -> Void) throws -> PAMRequest {
        let frame = bytes(encode)
        #expect(Int(frame[0]) << 8 | Int(frame[1]) == frame.count - 2)
        return try PAMRequest.decode(Array(frame.dropFirst(2)))
    }

    @Test func theModulesRequestsReadAsTheDaemonMeansThem() throws {
        #expect(try request { bk_encode_wait_for_push($0, "login", "tty1", ":0", "::1", "alice", 10_000) }
                == .waitForPush(.init(service: "login", tty: "tty1", display: ":0", remoteHost: "::1", expectedUser: "alice", timeoutMilliseconds: 10_000)))
        #expect(try request { bk_encode_cancel($0) } == .cancel)
        #expect(try request { bk_encode_intent($0) } == .intent)
        #expect(try request { bk_encode_report_outcome($0, BK_ACCEPTED_OTHER, "") } == .reportOutcome(.acceptedOther, reason: ""))
        #expect(try request { bk_encode_report_outcome($0, BK_REJECTED, "Authentication failure") } == .reportOutcome(.rejected, reason: "Authentication failure"))
        let password = Array("pässword".utf8)
        #expect(try request { f in password.withUnsafeBufferPointer { bk_encode_captured_password(f, $0.baseAddress, $0.count) } } == .capturedPassword(password))
        #expect(try request { bk_encode_open_session($0, "alice", "c7", "gdm-password", "ticket") }
                == .openSession(user: "alice", sessionID: "c7", service: "gdm-password", ticket: "ticket"))
        #expect(try request { bk_encode_close_session($0, "c7") } == .closeSession(sessionID: "c7"))
    }

    @Test func aLongStringIsCutAsTheDaemonsWriterCutsIt() throws {
        let long = String(repeating: "a", count: 300)
        let cut = try request { bk_encode_close_session($0, long) }
        #expect(cut == .closeSession(sessionID: String(repeating: "a", count: 255)))
        #expect(bytes { bk_encode_close_session($0, long) } == PAMRequest.closeSession(sessionID: long).encode())
    }

    /// The module's writer cut text at 255 bytes mid-character (the daemon then refused the
    /// frame as not UTF-8) and sent control characters the daemon's decoder refuses; it now
    /// writes exactly what the daemon's writer writes.
    @Test func cyrillicAndControlCharactersAreWrittenAsTheDaemonsWriterWritesThem() throws {
        for text in [String(repeating: "ж", count: 150), "a" + String(repeating: "ж", count: 150),
                     "tty\u{1b}[2Jx\u{7f}\u{85}y\n", String(repeating: "€", count: 90), String(repeating: "🔑", count: 70)] {
            #expect(bytes { bk_encode_close_session($0, text) } == PAMRequest.closeSession(sessionID: text).encode(), "\(text.prefix(12))")
            _ = try request { bk_encode_close_session($0, text) }  // the daemon reads it
        }
        #expect(try request { bk_encode_close_session($0, String(repeating: "ж", count: 150)) } == .closeSession(sessionID: String(repeating: "ж", count: 127)))
        #expect(try request { bk_encode_close_session($0, "tty\u{1b}[2Jx\u{7f}\u{85}y") } == .closeSession(sessionID: "tty [2Jx  y"))
        // Bytes that are not UTF-8 (a Latin-1 name, a cut sequence) arrive as U+FFFD.
        let latin1: [CChar] = [0x61, 0x6C, -0x01, 0x69, 0x63, 0x65, -0x3E, 0]  // "al\xFFice\xC2"
        #expect(try request { f in latin1.withUnsafeBufferPointer { bk_encode_close_session(f, $0.baseAddress) } } == .closeSession(sessionID: "al\u{FFFD}ice\u{FFFD}"))
    }

    /// What the C decoder makes of a frame body: the reply, or the daemon's error for it.
    func decodeInC(_ body: [UInt8]) -> Result<PAMReply, PAMWire.DecodeError> {
        let reply = UnsafeMutablePointer<bk_reply>.allocate(capacity: 1)
        defer { bk_reply_wipe(reply); reply.deallocate() }
        let e = body.withUnsafeBufferPointer { bk_decode_reply($0.baseAddress, $0.count, reply) }
        let r = reply.pointee
        func text(_ i: Int) -> String {
            withUnsafeBytes(of: r.text) { all in
                let field = all[(i * 256)..<(i * 256 + 256)]
                return String(decoding: field.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
        }
        switch e {
        case BK_DECODED: break
        case BK_TRUNCATED: return .failure(.truncated)
        case BK_TRAILING_BYTES: return .failure(.trailingBytes)
        case BK_UNSUPPORTED_VERSION: return .failure(.unsupportedVersion(body[0]))
        case BK_UNKNOWN_TYPE: return .failure(.unknownType(body[1]))
        case BK_TOO_LONG: return .failure(.tooLong(-1))
        case BK_INVALID_TEXT: return .failure(.invalidText)
        default: return .failure(.invalidValue(body.last ?? 0))
        }
        let secret = withUnsafeBytes(of: r.secret) { Array($0.prefix(r.secret_length)) }
        switch Int(r.kind) {
        case Int(BK_PROMPT.rawValue): return .success(.prompt(boxID: text(0), fingerprint: text(1), pairingCode: text(2), codeSeconds: r.number))
        case Int(BK_NOT_OFFERED.rawValue): return .success(.notOffered(text(0)))
        case Int(BK_PUSH.rawValue): return .success(.push(user: text(0), password: secret, ticket: text(1)))
        case Int(BK_KEY_LOGIN.rawValue): return .success(.keyLogin(user: text(0), ticket: text(1)))
        case Int(BK_ESCROW_CAPTURE.rawValue): return .success(.escrowCapture(user: text(0), ticket: text(1)))
        case Int(BK_NO_PUSH.rawValue): return .success(.noPush(.init(rawValue: UInt8(r.number))!))
        case Int(BK_NOTHING_YET_NEW_CODE.rawValue): return .success(.nothingYetNewCode(pairingCode: text(0), codeSeconds: r.number))
        case Int(BK_OK.rawValue): return .success(.ok)
        case Int(BK_ERROR.rawValue): return .success(.error(text(0)))
        default: Issue.record("the C decoder accepted type \(r.kind)"); return .failure(.unknownType(r.kind))
        }
    }

    func decodeInSwift(_ body: [UInt8]) -> Result<PAMReply, PAMWire.DecodeError> {
        do { return .success(try PAMReply.decode(body)) } catch { return .failure(error) }
    }

    /// Same verdict: both decode to the same reply, or both refuse for the same reason.
    func agree(_ body: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
        switch (decodeInC(body), decodeInSwift(body)) {
        case (.success(let c), .success(let swift)):
            #expect(c == swift, sourceLocation: sourceLocation)
        case (.failure(let c), .failure(let swift)) where c == swift: break
        case (.failure(.tooLong), .failure(.tooLong)): break
        case (.failure(.invalidValue), .failure(.invalidValue)): break
        case (let c, let swift): Issue.record("C: \(c), daemon: \(swift), body \(body)", sourceLocation: sourceLocation)
        }
    }

    static let replies: [PAMReply] = [
        .prompt(boxID: "4821", fingerprint: "ab:cd", pairingCode: "123456", codeSeconds: 300),
        .prompt(boxID: "4821", fingerprint: "ab:cd", pairingCode: "", codeSeconds: 0),
        .notOffered("not a local session"),
        .push(user: "alice", password: Array("correct horse".utf8), ticket: "t1"),
        .push(user: "жанна", password: [UInt8](repeating: 0x41, count: 512), ticket: ""),
        .keyLogin(user: "alice", ticket: "t"), .escrowCapture(user: "alice", ticket: "t"),
        .noPush(.nothingYet), .noPush(.timedOut), .noPush(.superseded), .noPush(.shuttingDown),
        .nothingYetNewCode(pairingCode: "654321", codeSeconds: 120),
        .ok, .error("no"),
    ]

    @Test func theDaemonsRepliesReadTheSameInTheModule() {
        for reply in Self.replies { agree(Array(reply.encode().dropFirst(2))) }
    }

    @Test func whatTheDaemonRefusesTheModuleRefuses() {
        let v = PAMWire.version
        let crafted: [[UInt8]] = [
            [], [v], [2, 0x84], [v, 0x99], [v, 0x84, 0],            // empty, no type, old version, unknown type, trailing
            [v, 0x82, 5, 0x61, 0x6c], [v, 0x82, 0, 0, 2, 0x70, 0x77, 0],       // truncated; a push for nobody
            [v, 0x82, 1, 0x61, 0, 0], [v, 0x82, 1, 0x61, 0, 2, 0x70, 0, 0],   // no password; a NUL inside it
            [v, 0x82, 1, 0x61, 0x02, 0x01] + [UInt8](repeating: 0x41, count: 513) + [0], // a 513-byte secret
            [v, 0x87, 2, 0x1b, 0x5b], [v, 0x87, 1, 0x7f], [v, 0x87, 2, 0xc0, 0xaf],    // ESC, DEL, overlong '/'
            [v, 0x87, 3, 0xed, 0xa0, 0x80], [v, 0x87, 4, 0xf4, 0x90, 0x80, 0x80], // a surrogate, past U+10FFFF
            [v, 0x87, 2, 0xc2, 0x85], [v, 0x83, 4], [v, 0x88, 0, 0], [v, 0x86, 0, 2, 0x61, 0x62], // admin output (0x86): the admin socket's
            [UInt8](repeating: v, count: PAMWire.maxFrameLength + 1),
        ]
        for body in crafted { agree(body) }
    }

    @Test func randomFramesGetTheSameVerdict() {
        var generator = SystemRandomNumberGenerator()
        let v = PAMWire.version
        for _ in 0..<20_000 {
            // Mostly well-formed heads, so the bodies' decoders are reached.
            let kind = [0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x80][Int.random(in: 0..<10, using: &generator)]
            var body: [UInt8] = [v, UInt8(kind)]
            for _ in 0..<Int.random(in: 0..<24, using: &generator) {
                body.append(Bool.random(using: &generator) ? UInt8.random(in: 0...8, using: &generator) : UInt8.random(in: 0...255, using: &generator))
            }
            agree(body)
        }
        for reply in Self.replies {
            let body = Array(reply.encode().dropFirst(2))
            for cut in 0..<body.count { agree(Array(body.prefix(cut))) }
        }
    }
}
