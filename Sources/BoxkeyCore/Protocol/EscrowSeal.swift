/// Escrow mode's sealed password: the box keeps `seal(...)` on its disk, the phone keeps the
/// secret, and only the two together give the password back. Pure.
///
///     key = BLAKE2b(key: escrow secret, "boxkey escrow v1" | box key | phone key | user)
///     box keeps: nonce (24, random) | XChaCha20-Poly1305(key, nonce, ad = the same context, password)
///
/// The context binds a sealed copy to one box, one phone and one user: moved to another
/// record, or opened with another phone's secret, it fails authentication.
public enum EscrowSeal {
    static let label = Array("boxkey escrow v1".utf8)

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
        return Sealed(nonce: nonce, ciphertext: XChaChaPoly.seal(key: key(secret: secret, context: ad), nonce: nonce, ad: ad, plaintext: password))
    }

    public static func open(_ sealed: Sealed, secret: SecureBytes, boxKey: PublicKey, phoneKey: PublicKey, user: String) throws(CryptoError) -> SecureBytes {
        let ad = context(boxKey: boxKey, phoneKey: phoneKey, user: user)
        return try XChaChaPoly.open(key: key(secret: secret, context: ad), nonce: sealed.nonce, ad: ad, ciphertext: sealed.ciphertext)
    }
}
