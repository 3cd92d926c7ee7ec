/// Escrow mode's sealed password: the box keeps `seal(...)` on its disk, the phone keeps the
/// secret, and only the two together give the password back. Pure.
///
///     box's secret = BLAKE2b(key: the phone's escrow secret, "boxkey escrow box v1" | box key)
///     key = BLAKE2b(key: box's secret, "boxkey escrow v1" | box key | phone key | user)
///     box keeps: nonce (24, random) | XChaCha20-Poly1305(key, nonce, ad = the same context,
///                                       password length (2, BE) | password | zeros to 514 bytes)
///
/// The phone sends each box only that box's secret, so a box (or its root) learns nothing that
/// opens another box's copy. The context binds a sealed copy to one box, one phone and one
/// user: moved to another record, or opened with another phone's secret, it fails
/// authentication. The padding hides the password's length.
public enum EscrowSeal {
    static let label = Array("boxkey escrow v1".utf8)
    static let boxLabel = Array("boxkey escrow box v1".utf8)
    /// Sealed plaintext: the length, then the password padded to the longest PAM takes.
    static let paddedLength = 2 + CredentialPush.maxPasswordLength

    /// What the phone sends box `boxKey` in place of its escrow secret (phone side).
    public static func boxSecret(master: SecureBytes, boxKey: PublicKey) -> SecureBytes {
        Blake2b.mac(key: master, secret: SecureBytes(copying: boxLabel + boxKey.bytes))
    }

    public struct Sealed: Codable, Equatable, Sendable {
        public var nonce: [UInt8]
        public var ciphertext: [UInt8]
    }

    static func context(boxKey: PublicKey, phoneKey: PublicKey, user: String) -> [UInt8] {
        label + boxKey.bytes + phoneKey.bytes + Array(user.utf8)
    }

    static func key(secret: SecureBytes, context: [UInt8]) -> SecureBytes {
        Blake2b.mac(key: secret, secret: SecureBytes(copying: context))
    }

    public static func seal(password: SecureBytes, secret: SecureBytes, boxKey: PublicKey, phoneKey: PublicKey, user: String) -> Sealed {
        let ad = context(boxKey: boxKey, phoneKey: phoneKey, user: user)
        let nonce = SystemRandom.bytes(XChaChaPoly.nonceLength)
        let n = min(password.count, CredentialPush.maxPasswordLength)
        let padded = SecureBytes(count: paddedLength) { (o: UnsafeMutableRawBufferPointer) in
            o.initializeMemory(as: UInt8.self, repeating: 0)
            o[0] = UInt8(n >> 8); o[1] = UInt8(n & 0xff)
            password.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: o[2..<(2 + n)]).copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
        return Sealed(nonce: nonce, ciphertext: XChaChaPoly.seal(key: key(secret: secret, context: ad), nonce: nonce, ad: ad, plaintext: padded))
    }

    public static func open(_ sealed: Sealed, secret: SecureBytes, boxKey: PublicKey, phoneKey: PublicKey, user: String) throws(CryptoError) -> SecureBytes {
        let ad = context(boxKey: boxKey, phoneKey: phoneKey, user: user)
        let padded = try XChaChaPoly.open(key: key(secret: secret, context: ad), nonce: sealed.nonce, ad: ad, ciphertext: sealed.ciphertext)
        return try padded.withUnsafeBytes { (p) throws(CryptoError) -> SecureBytes in
            guard p.count == paddedLength else { throw .authenticationFailed }
            let n = Int(p[0]) << 8 | Int(p[1])
            guard n > 0, n <= CredentialPush.maxPasswordLength else { throw .authenticationFailed }
            return SecureBytes(copying: UnsafeRawBufferPointer(rebasing: p[2..<(2 + n)]))
        }
    }
}
