import Testing
@testable import BoxkeyCore

@Suite struct CryptoTests {
    @Test func secureBytesNeverPrintTheirContents() {
        let secret = SecureBytes(utf8: "hunter2")
        #expect(!"\(secret)".contains("hunter2"))
        #expect(!String(reflecting: secret).contains("hunter2"))
        #expect("\(Fixtures.push(password: "hunter2"))".contains("redacted"))
        #expect(!"\(Fixtures.push(password: "hunter2"))".contains("hunter2"))
    }

    @Test func secureBytesCompareInConstantTimeAndByValue() {
        #expect(SecureBytes(utf8: "abc").isEqual(to: SecureBytes(utf8: "abc")))
        #expect(!SecureBytes(utf8: "abc").isEqual(to: SecureBytes(utf8: "abd")))
        #expect(!SecureBytes(utf8: "abc").isEqual(to: SecureBytes(utf8: "abcd")))
    }

    @Test func x25519AgreesAndRejectsLowOrderPoints() throws {
        let a = KeyPair.generate(), b = KeyPair.generate()
        let ab = try X25519.sharedSecret(a.privateKey, b.publicKey)
        let ba = try X25519.sharedSecret(b.privateKey, a.publicKey)
        #expect(ab.isEqual(to: ba))
        let zeroPoint = try PublicKey([UInt8](repeating: 0, count: 32))
        #expect(throws: CryptoError.weakPublicKey) { try X25519.sharedSecret(a.privateKey, zeroPoint) }
    }

    @Test func publicKeyRejectsWrongLength() {
        #expect(throws: CryptoError.invalidLength(expected: 32, actual: 31)) { try PublicKey([UInt8](repeating: 1, count: 31)) }
    }

    @Test func chachaPolyRoundTripsAndDetectsTampering() throws {
        let key = SecureBytes.random(count: 32)
        var sealed = Array("attack at dawn".utf8).withUnsafeBytes { ChaChaPoly.seal(key: key, nonce: 7, ad: [1, 2], plaintext: $0) }
        let opened = try sealed.withUnsafeBytes { try ChaChaPoly.open(key: key, nonce: 7, ad: [1, 2], ciphertext: $0) }
        #expect(opened.unprotectedCopy == Array("attack at dawn".utf8))
        #expect(throws: CryptoError.authenticationFailed) {
            try sealed.withUnsafeBytes { try ChaChaPoly.open(key: key, nonce: 8, ad: [1, 2], ciphertext: $0) }
        }
        sealed[0] ^= 1
        #expect(throws: CryptoError.authenticationFailed) {
            try sealed.withUnsafeBytes { try ChaChaPoly.open(key: key, nonce: 7, ad: [1, 2], ciphertext: $0) }
        }
    }

    /// RFC 7693 Appendix A: BLAKE2b-512("abc").
    @Test func blake2bMatchesRFC7693() {
        #expect(hex(Blake2b.hash(Array("abc".utf8))) ==
            "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923")
    }

    @Test func fingerprintIsFourGroupsOfHex() {
        let fp = Fixtures.box.publicKey.fingerprint
        #expect(fp.count == 19)
        #expect(fp.split(separator: "-").count == 4)
        #expect(fp != Fixtures.phone.publicKey.fingerprint)
    }

    @Test func hexRoundTrips() {
        #expect(unhex(hex([0, 1, 0xfe, 0xff])) == [0, 1, 0xfe, 0xff])
        #expect(unhex("0g") == nil)
        #expect(unhex("abc") == nil)
    }
}
