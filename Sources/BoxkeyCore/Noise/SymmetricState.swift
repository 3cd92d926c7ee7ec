/// Noise section 5.2 SymmetricState for Noise_*_25519_ChaChaPoly_BLAKE2b.
struct SymmetricState {
    var chainingKey: SecureBytes
    var handshakeHash: [UInt8]
    var cipher = CipherState()

    init(protocolName: String) {
        var name = Array(protocolName.utf8)
        if name.count <= Blake2b.hashLength {
            name += [UInt8](repeating: 0, count: Blake2b.hashLength - name.count)
            handshakeHash = name
        } else {
            handshakeHash = Blake2b.hash(name)
        }
        chainingKey = SecureBytes(copying: handshakeHash)
    }

    mutating func mixKey(_ inputKeyMaterial: SecureBytes) {
        let outputs = inputKeyMaterial.withUnsafeBytes {
            Blake2b.noiseHKDF(chainingKey: chainingKey, inputKeyMaterial: $0, outputs: 2)
        }
        chainingKey = outputs[0]
        // HASHLEN is 64, so the cipher key is truncated to 32 bytes (Noise section 5.2).
        cipher = CipherState(key: outputs[1].prefix(ChaChaPoly.keyLength))
    }

    /// Noise section 5.2 MixKeyAndHash, for the `psk` token: HKDF with three outputs.
    mutating func mixKeyAndHash(_ inputKeyMaterial: SecureBytes) {
        let outputs = inputKeyMaterial.withUnsafeBytes {
            Blake2b.noiseHKDF(chainingKey: chainingKey, inputKeyMaterial: $0, outputs: 3)
        }
        chainingKey = outputs[0]
        mixHash(outputs[1].unprotectedCopy)
        cipher = CipherState(key: outputs[2].prefix(ChaChaPoly.keyLength))
    }

    mutating func mixHash(_ data: [UInt8]) {
        handshakeHash = Blake2b.hash(handshakeHash, data)
    }

    mutating func encryptAndHash(_ plaintext: UnsafeRawBufferPointer) throws(NoiseError) -> [UInt8] {
        let ciphertext = try cipher.encrypt(ad: handshakeHash, plaintext: plaintext)
        mixHash(ciphertext)
        return ciphertext
    }

    mutating func decryptAndHash(_ ciphertext: ArraySlice<UInt8>) throws(NoiseError) -> SecureBytes {
        let bytes = Array(ciphertext)
        let plaintext = try bytes.withBytes { (c) throws(NoiseError) -> SecureBytes in
            try cipher.decrypt(ad: handshakeHash, ciphertext: c)
        }
        mixHash(bytes)
        return plaintext
    }

    /// Noise section 5.2 Split: two CipherStates, initiator-to-responder first.
    func split() -> (CipherState, CipherState) {
        let outputs = [UInt8]().withUnsafeBytes {
            Blake2b.noiseHKDF(chainingKey: chainingKey, inputKeyMaterial: $0, outputs: 2)
        }
        return (CipherState(key: outputs[0].prefix(ChaChaPoly.keyLength)),
                CipherState(key: outputs[1].prefix(ChaChaPoly.keyLength)))
    }
}
