@testable import BoxkeyCore
import Testing

/// Escrow mode's sealed password: the box's copy and the phone's secret, each useless alone.
@Suite struct EscrowTests {
    let password = SecureBytes(utf8: "correct horse")
    let secret = SecureBytes.random(count: CredentialPush.escrowSecretLength)
    let box = Fixtures.box.publicKey, phone = Fixtures.phone.publicKey

    @Test func theSecretOpensTheCopyItSealed() throws {
        let sealed = EscrowSeal.seal(password: password, secret: secret, boxKey: box, phoneKey: phone, user: "alice")
        #expect(try EscrowSeal.open(sealed, secret: secret, boxKey: box, phoneKey: phone, user: "alice").isEqual(to: password))
        #expect(!sealed.ciphertext.containsSubsequence(Array("correct horse".utf8)))
    }

    @Test func anotherSecretPhoneBoxOrUserOpensNothing() {
        let sealed = EscrowSeal.seal(password: password, secret: secret, boxKey: box, phoneKey: phone, user: "alice")
        let other = Fixtures.keyPair(0x33).publicKey
        #expect(throws: CryptoError.authenticationFailed) { try EscrowSeal.open(sealed, secret: .random(count: 32), boxKey: box, phoneKey: phone, user: "alice") }
        #expect(throws: CryptoError.authenticationFailed) { try EscrowSeal.open(sealed, secret: secret, boxKey: box, phoneKey: other, user: "alice") }
        #expect(throws: CryptoError.authenticationFailed) { try EscrowSeal.open(sealed, secret: secret, boxKey: other, phoneKey: phone, user: "alice") }
        #expect(throws: CryptoError.authenticationFailed) { try EscrowSeal.open(sealed, secret: secret, boxKey: box, phoneKey: phone, user: "bob") }
        var tampered = sealed
        tampered.ciphertext[0] ^= 1
        #expect(throws: CryptoError.authenticationFailed) { try EscrowSeal.open(tampered, secret: secret, boxKey: box, phoneKey: phone, user: "alice") }
    }

    @Test func aSealedCopyDoesNotTellThePasswordsLength() throws {
        let short = EscrowSeal.seal(password: SecureBytes(utf8: "a"), secret: secret, boxKey: box, phoneKey: phone, user: "alice")
        let long = EscrowSeal.seal(password: SecureBytes(utf8: String(repeating: "x", count: 512)), secret: secret, boxKey: box, phoneKey: phone, user: "alice")
        #expect(short.ciphertext.count == long.ciphertext.count)
        #expect(try EscrowSeal.open(short, secret: secret, boxKey: box, phoneKey: phone, user: "alice").isEqual(to: SecureBytes(utf8: "a")))
    }

    /// The phone sends each box a secret of its own: one box's (or its root's) copy of what the
    /// phone sent opens no other box's sealed password.
    @Test func eachBoxGetsItsOwnSecret() {
        let other = Fixtures.keyPair(0x44).publicKey
        let mine = EscrowSeal.boxSecret(master: secret, boxKey: box), theirs = EscrowSeal.boxSecret(master: secret, boxKey: other)
        #expect(!mine.isEqual(to: theirs) && !mine.isEqual(to: secret))
        #expect(mine.isEqual(to: EscrowSeal.boxSecret(master: secret, boxKey: box)))
        let sealed = EscrowSeal.seal(password: password, secret: mine, boxKey: box, phoneKey: phone, user: "alice")
        #expect(throws: CryptoError.authenticationFailed) { try EscrowSeal.open(sealed, secret: theirs, boxKey: box, phoneKey: phone, user: "alice") }
    }

    @Test func aPushSaysWhichKindItIs() throws {
        #expect(Fixtures.push().kind == .password)
        #expect(Fixtures.push(password: "").kind == .key)
        let escrow = CredentialPush(user: "alice", password: CredentialPush.escrowField(secret), deviceName: "p")
        #expect(escrow.kind == .escrow && escrow.escrowSecret!.isEqual(to: secret))
        // Through the wire: the NUL form decodes; a NUL anywhere else in a password does not.
        guard case .credentialPush(let decoded) = try AppMessage.decode(AppMessage.credentialPush(escrow).encode()) else { Issue.record("not a push"); return }
        #expect(decoded.kind == .escrow && decoded.escrowSecret!.isEqual(to: secret))
        let short = CredentialPush(user: "alice", password: SecureBytes(copying: [0] + [UInt8](repeating: 7, count: 31)), deviceName: "p")
        #expect(throws: AppMessage.DecodeError.invalidText(field: "password")) { try short.validate() }
        #expect(throws: AppMessage.DecodeError.invalidText(field: "password")) { try AppMessage.decode(AppMessage.credentialPush(short).encode()) }
    }
}

extension Array where Element == UInt8 {
    func containsSubsequence(_ needle: [UInt8]) -> Bool {
        guard needle.count <= count else { return false }
        return (0...(count - needle.count)).contains { Array(self[$0..<$0 + needle.count]) == needle }
    }
}
