import CSodium

/// Argon2id (libsodium `crypto_pwhash`, ALG_ARGON2ID13): turns a PIN into a key at a cost in
/// time and memory that an attacker pays for every guess.
public enum Argon2id {
    public static let saltLength = Int(crypto_pwhash_SALTBYTES)

    public struct Parameters: Codable, Equatable, Sendable {
        /// Passes over memory (opslimit).
        public var operations: UInt64
        /// Bytes of memory (memlimit).
        public var memory: Int
        /// The vault's parameters: 256 MiB and 3 passes (libsodium's MODERATE), about 0.4 s per
        /// guess on a current x86-64 core: the floor is 0.25 s and 64 MiB (docs/threat-model.md).
        public static let vault = Parameters(operations: 3, memory: 256 << 20)
        public init(operations: UInt64, memory: Int) {
            self.operations = operations
            self.memory = memory
        }
    }

    public static func deriveKey(secret: SecureBytes, salt: [UInt8], parameters: Parameters, length: Int = 32) throws(CryptoError) -> SecureBytes {
        requireSodium()
        guard salt.count == saltLength else { throw .invalidLength(expected: saltLength, actual: salt.count) }
        let out = SecureBytes(count: length)
        let rc = out.withUnsafeMutableBytes { o in
            secret.withUnsafeBytes { s in
                crypto_pwhash(o.bindMemory(to: UInt8.self).baseAddress!, UInt64(length),
                              s.bindMemory(to: CChar.self).baseAddress!, UInt64(s.count), salt,
                              parameters.operations, parameters.memory, crypto_pwhash_ALG_ARGON2ID13)
            }
        }
        guard rc == 0 else { throw .secureMemoryExhausted }
        return out
    }
}

/// XChaCha20-Poly1305 (192-bit random nonces) for data at rest.
public enum XChaChaPoly {
    public static let nonceLength = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    public static let tagLength = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)

    public static func seal(key: SecureBytes, nonce: [UInt8], ad: [UInt8], plaintext: SecureBytes) -> [UInt8] {
        requireSodium()
        var out = [UInt8](repeating: 0, count: plaintext.count + tagLength)
        var length: UInt64 = 0
        key.withUnsafeBytes { k in
            plaintext.withUnsafeBytes { p in
                _ = crypto_aead_xchacha20poly1305_ietf_encrypt(&out, &length, p.bindMemory(to: UInt8.self).baseAddress!, UInt64(p.count),
                                                               ad, UInt64(ad.count), nil, nonce, k.bindMemory(to: UInt8.self).baseAddress!)
            }
        }
        return out
    }

    public static func open(key: SecureBytes, nonce: [UInt8], ad: [UInt8], ciphertext: [UInt8]) throws(CryptoError) -> SecureBytes {
        requireSodium()
        guard ciphertext.count >= tagLength, nonce.count == nonceLength else { throw .authenticationFailed }
        let out = SecureBytes(count: ciphertext.count - tagLength)
        var length: UInt64 = 0
        let rc = key.withUnsafeBytes { k in
            out.withUnsafeMutableBytes { o in
                crypto_aead_xchacha20poly1305_ietf_decrypt(o.bindMemory(to: UInt8.self).baseAddress!, &length, nil, ciphertext, UInt64(ciphertext.count),
                                                           ad, UInt64(ad.count), nonce, k.bindMemory(to: UInt8.self).baseAddress!)
            }
        }
        guard rc == 0 else { throw .authenticationFailed }
        return out
    }
}

extension Blake2b {
    /// Keyed BLAKE2b (a MAC), for values that are not Noise's business.
    public static func mac(key: SecureBytes, _ data: [UInt8], outputLength: Int = 32) -> [UInt8] {
        requireSodium()
        var out = [UInt8](repeating: 0, count: outputLength)
        key.withUnsafeBytes { k in
            _ = crypto_generichash(&out, outputLength, data, UInt64(data.count), k.bindMemory(to: UInt8.self).baseAddress!, k.count)
        }
        return out
    }

    /// Keyed BLAKE2b of a secret, into secure memory.
    public static func mac(key: SecureBytes, secret: SecureBytes, outputLength: Int = 32) -> SecureBytes {
        requireSodium()
        let out = SecureBytes(count: outputLength)
        out.withUnsafeMutableBytes { o in
            key.withUnsafeBytes { k in
                secret.withUnsafeBytes { s in
                    _ = crypto_generichash(o.bindMemory(to: UInt8.self).baseAddress!, outputLength, s.bindMemory(to: UInt8.self).baseAddress!, UInt64(s.count),
                                           k.bindMemory(to: UInt8.self).baseAddress!, k.count)
                }
            }
        }
        return out
    }
}
