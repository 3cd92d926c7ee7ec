/// Errors from the Noise layer.
public enum NoiseError: Error, Equatable, Sendable {
    /// A handshake message had the wrong length for its position in the IK pattern.
    case badMessageLength(expected: Int, actual: Int)
    /// Decryption failed: wrong static key, tampered message, wrong prologue, or a replay.
    case decryptFailed
    /// The peer sent a low-order public key.
    case weakKey
    /// The 64-bit nonce reached 2^64-1, which Noise section 5.1 reserves; the session must end.
    case nonceExhausted
    /// A transport message exceeded the Noise maximum of 65535 bytes.
    case messageTooLong
    /// The handshake was used out of order (for example reading message 2 twice).
    case wrongHandshakeStep
}

/// Noise section 5.1 CipherState: a key and a 64-bit counter nonce.
public struct CipherState: Sendable {
    /// Noise reserves 2^64-1 for rekey; using it for a message is an error.
    public static let maxNonce = UInt64.max

    private(set) var key: SecureBytes?
    /// Next nonce to use. Exposed for tests of nonce exhaustion.
    public internal(set) var nonce: UInt64 = 0

    init(key: SecureBytes? = nil) { self.key = key }

    var hasKey: Bool { key != nil }

    mutating func encrypt(ad: [UInt8], plaintext: UnsafeRawBufferPointer) throws(NoiseError) -> [UInt8] {
        guard let key else { return Array(plaintext) }
        guard nonce < Self.maxNonce else { throw .nonceExhausted }
        let out = ChaChaPoly.seal(key: key, nonce: nonce, ad: ad, plaintext: plaintext)
        nonce += 1
        return out
    }

    /// The nonce advances only when the tag verifies, so a forged or replayed message cannot
    /// desynchronise the channel (Noise section 5.1, DecryptWithAd).
    mutating func decrypt(ad: [UInt8], ciphertext: UnsafeRawBufferPointer) throws(NoiseError) -> SecureBytes {
        guard let key else { return SecureBytes(copying: ciphertext) }
        guard nonce < Self.maxNonce else { throw .nonceExhausted }
        do {
            let out = try ChaChaPoly.open(key: key, nonce: nonce, ad: ad, ciphertext: ciphertext)
            nonce += 1
            return out
        } catch {
            throw .decryptFailed
        }
    }

    /// Noise section 4.2 REKEY: k = ENCRYPT(k, maxnonce, zerolen, zeros)[0..<32]. The nonce is kept.
    mutating func rekey() {
        guard let key else { return }
        let zeros = [UInt8](repeating: 0, count: 32)
        var next = zeros.withUnsafeBytes { ChaChaPoly.seal(key: key, nonce: Self.maxNonce, ad: [], plaintext: $0) }
        self.key = SecureBytes(copying: Array(next[0..<32]))
        secureZero(&next)
    }
}
