import Testing
@testable import BoxkeyCore

@Suite struct EnvelopeTests {
    @Test func fixedLengthsAreExact() throws {
        let m1 = Envelope.handshakeInit(advertisementNonce: 0xBEEF, noise: [UInt8](repeating: 1, count: 96)).encode()
        #expect(m1.count == Envelope.handshakeInitLength && m1.count == 100)
        #expect(try Envelope.decode(m1) == .handshakeInit(advertisementNonce: 0xBEEF, noise: [UInt8](repeating: 1, count: 96)))
        #expect(throws: Envelope.DecodeError.wrongLength(kind: 1, expected: 100, actual: 101)) { try Envelope.decode(m1 + [0]) }
        #expect(throws: Envelope.DecodeError.wrongLength(kind: 1, expected: 100, actual: 99)) { try Envelope.decode(Array(m1.dropLast())) }
        let m2 = Envelope.handshakeResponse(noise: [UInt8](repeating: 2, count: 48)).encode()
        #expect(m2.count == 50)
        #expect(throws: Envelope.DecodeError.wrongLength(kind: 2, expected: 50, actual: 49)) { try Envelope.decode(Array(m2.dropLast())) }
        #expect(throws: Envelope.DecodeError.wrongLength(kind: 3, expected: 19, actual: 18)) { try Envelope.decode([BoxkeyProtocol.version, 3] + [UInt8](repeating: 0, count: 16)) }
    }

    @Test func unknownVersionsAndKindsAreRejected() {
        #expect(throws: Envelope.DecodeError.unsupportedVersion(2)) { try Envelope.decode([2, 3] + [UInt8](repeating: 0, count: 20)) }
        // Version 3 phones would take the box's awaitingEnter for a broken channel: refused whole.
        #expect(throws: Envelope.DecodeError.unsupportedVersion(3)) { try Envelope.decode([3, 3] + [UInt8](repeating: 0, count: 20)) }
        #expect(throws: Envelope.DecodeError.unsupportedVersion(0)) { try Envelope.decode([0, 1]) }
        #expect(throws: Envelope.DecodeError.unknownKind(9)) { try Envelope.decode([BoxkeyProtocol.version, 9, 0]) }
        #expect(throws: Envelope.DecodeError.tooShort(1)) { try Envelope.decode([BoxkeyProtocol.version]) }
        #expect(throws: Envelope.DecodeError.tooLong(1025)) { try Envelope.decode([BoxkeyProtocol.version, 3] + [UInt8](repeating: 0, count: 1023)) }
    }

    @Test func refusalIsReadableFromAnyVersion() throws {
        // A v7 box refusing a v2 phone must still be understood: the refusal layout is frozen.
        #expect(try Envelope.decode([7, 4, 1, 7, 7]) == .refusal(Refusal(.unsupportedVersion, versions: 7...7)))
        #expect(try Envelope.decode([2, 4, 0x42, 2, 2]) == .refusal(Refusal(.unknown, versions: 2...2)))
        #expect(throws: Envelope.DecodeError.wrongLength(kind: 4, expected: 5, actual: 5)) { try Envelope.decode([2, 4, 1, 3, 2]) }
    }
}

@Suite struct AppMessageTests {
    static let samples: [AppMessage] = [
        .credentialPush(Fixtures.push()),
        .credentialPush(Fixtures.push(user: "ålice@CORP.EXAMPLE", password: String(repeating: "p", count: 512), device: "")),
        .loginResult(LoginResult(.accepted)),
        .loginResult(LoginResult(.rejected, reason: "Authentication failure")),
        .loginResult(LoginResult(.notAtPrompt, reason: "box is not at a login prompt")),
        .lock, .logout, .attach, .keepalive, .detach, .withdraw, .pair, .intent,
        .actionResult(ActionResult(action: .lock, outcome: .done)),
        .actionResult(ActionResult(action: .attach, outcome: .noSession)),
        .error(ChannelError(.unexpectedMessage, detail: "no")),
    ]

    @Test(arguments: samples)
    func roundTrips(_ m: AppMessage) throws {
        #expect(try AppMessage.decode(m.encode()) == m)
    }

    @Test func everyMessageRejectsTrailingBytesAndTruncation() throws {
        for m in Self.samples {
            let bytes = m.encode().unprotectedCopy
            #expect(throws: AppMessage.DecodeError.trailingBytes(m.type)) { try AppMessage.decode(SecureBytes(copying: bytes + [0])) }
            if bytes.count > 1 {
                #expect(throws: AppMessage.DecodeError.self) { try AppMessage.decode(SecureBytes(copying: Array(bytes.dropLast()))) }
            }
        }
    }

    @Test func credentialPushLayoutIsAsDocumented() {
        let bytes = AppMessage.credentialPush(Fixtures.push(user: "bob", password: "pw", device: "p")).encode().unprotectedCopy
        #expect(bytes == [0x01, 3, 98, 111, 98, 0, 2, 112, 119, 1, 112])
        #expect(CredentialPush.maxEncodedLength == 677)
        #expect(Envelope.headerLength + CredentialPush.maxEncodedLength + NoiseIK.transportOverhead <= Envelope.maxLength)
    }

    @Test func fieldLimitsAndContentAreEnforced() {
        func push(_ bytes: [UInt8]) throws { _ = try AppMessage.decode(SecureBytes(copying: bytes)) }
        #expect(throws: AppMessage.DecodeError.fieldEmpty(field: "user")) { try push([1, 0, 0, 1, 0x41, 0]) }
        #expect(throws: AppMessage.DecodeError.fieldTooLong(field: "user", length: 129, limit: 128)) { try push([1, 129] + [UInt8](repeating: 0x61, count: 129) + [0, 1, 0x41, 0]) }
        // No password: a key login, which only a box in key mode takes.
        if case .credentialPush(let keyLogin)? = try? AppMessage.decode(SecureBytes(copying: [1, 1, 0x61, 0, 0, 0])) {
            #expect(keyLogin.isKeyLogin && keyLogin.user == "a")
        } else { Issue.record("a push without a password does not decode") }
        #expect(throws: AppMessage.DecodeError.fieldTooLong(field: "password", length: 513, limit: 512)) { try push([1, 1, 0x61, 2, 1, 0]) }
        #expect(throws: AppMessage.DecodeError.invalidText(field: "password")) { try push([1, 1, 0x61, 0, 2, 0x41, 0x00, 0]) }
        #expect(throws: AppMessage.DecodeError.invalidText(field: "user")) { try push([1, 1, 0x0a, 0, 1, 0x41, 0]) }
        #expect(throws: AppMessage.DecodeError.invalidText(field: "user")) { try push([1, 2, 0xc3, 0x28, 0, 1, 0x41, 0]) }
        #expect(throws: AppMessage.DecodeError.fieldTooLong(field: "deviceName", length: 33, limit: 32)) { try push([1, 1, 0x61, 0, 1, 0x41, 33] + [UInt8](repeating: 0x61, count: 33)) }
        #expect(throws: AppMessage.DecodeError.unknownType(0x42)) { try push([0x42]) }
        #expect(throws: AppMessage.DecodeError.empty) { try push([]) }
        #expect(throws: AppMessage.DecodeError.unknownValue(field: "outcome", value: 9)) { try push([2, 9, 0]) }
        #expect(throws: AppMessage.DecodeError.unknownValue(field: "action", value: 0)) { try push([6, 0, 0]) }
    }

    @Test func senderValidatesWithTheSameRules() {
        #expect(throws: AppMessage.DecodeError.invalidText(field: "user")) { try Fixtures.push(user: "a\nb").validate() }
        #expect(throws: Never.self) { try Fixtures.push(password: "").validate() }
        #expect(throws: AppMessage.DecodeError.fieldTooLong(field: "deviceName", length: 40, limit: 32)) { try Fixtures.push(device: String(repeating: "x", count: 40)).validate() }
    }
}
