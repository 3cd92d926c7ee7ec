import CSodium

/// How people check and name keys (box, phone and fleet keys alike).
public enum Fingerprint {
    /// BLAKE2b-256 of the key, first 8 bytes, as four groups of four hex digits
    /// ("7F3A-91C2-0B4D-E815"). 64 bits: a second key with the same fingerprint costs an
    /// attacker ~2^64 work, far beyond a pairing window.
    public static func of(_ key: [UInt8]) -> String {
        let digest = Blake2b.hash(key, outputLength: 32)
        return stride(from: 0, to: 8, by: 2).map { hex(Array(digest[$0..<$0 + 2])).uppercased() }.joined(separator: "-")
    }

    /// Whether `fingerprint` starts with what a person typed: a non-empty prefix, in either
    /// case, with or without the dashes.
    public static func matches(_ fingerprint: String, prefix typed: String) -> Bool {
        let wanted = typed.uppercased().filter { $0 != "-" }
        return !wanted.isEmpty && fingerprint.filter { $0 != "-" }.hasPrefix(wanted)
    }
}

/// A Curve25519 public key (32 bytes). Not secret; hashable so it can key trust stores.
public struct PublicKey: Hashable, Sendable, CustomStringConvertible {
    public static let length = 32
    public let bytes: [UInt8]

    public init(_ bytes: [UInt8]) throws(CryptoError) {
        guard bytes.count == Self.length else {
            throw .invalidLength(expected: Self.length, actual: bytes.count)
        }
        self.bytes = bytes
    }

    public init<C: Collection<UInt8>>(_ bytes: C) throws(CryptoError) {
        try self.init(Array(bytes))
    }

    public var fingerprint: String { Fingerprint.of(bytes) }

    /// One byte of the same digest, carried in the advertisement as a hint so a phone can skip a
    /// box with the right ID but the wrong key without connecting. Not a security check.
    public var advertisementHint: UInt8 {
        Blake2b.hash(bytes, outputLength: 32)[0]
    }

    public var description: String { "PublicKey(\(fingerprint))" }
}

/// An X25519 key pair whose private half lives in secure memory.
public struct KeyPair: Sendable {
    public let privateKey: SecureBytes
    public let publicKey: PublicKey

    public static func generate() -> KeyPair {
        requireSodium()
        let priv = SecureBytes.random(count: X25519.keyLength)
        return try! KeyPair(privateKey: priv)
    }

    /// Rebuilds a key pair from a stored private key.
    public init(privateKey: SecureBytes) throws(CryptoError) {
        guard privateKey.count == X25519.keyLength else {
            throw .invalidLength(expected: X25519.keyLength, actual: privateKey.count)
        }
        var pub = [UInt8](repeating: 0, count: X25519.keyLength)
        privateKey.withUnsafeBytes { sk in
            _ = pub.withUnsafeMutableBytes { crypto_scalarmult_base($0.baseAddress!, sk.baseAddress!) }
        }
        self.privateKey = privateKey
        self.publicKey = try PublicKey(pub)
    }
}

public enum X25519 {
    public static let keyLength = 32

    /// DH(privateKey, publicKey) per Noise section 4.1. Rejects an all-zero result (low-order
    /// point), which libsodium signals with -1.
    public static func sharedSecret(_ privateKey: SecureBytes, _ publicKey: PublicKey) throws(CryptoError) -> SecureBytes {
        let out = SecureBytes(count: keyLength)
        let rc = out.withUnsafeMutableBytes { o in
            privateKey.withUnsafeBytes { sk in
                publicKey.bytes.withUnsafeBytes { pk in
                    crypto_scalarmult(o.baseAddress!, sk.baseAddress!, pk.baseAddress!)
                }
            }
        }
        guard rc == 0 else { throw .weakPublicKey }
        return out
    }
}

/// ChaCha20-Poly1305 (IETF, 96-bit nonce) as Noise section 12.3 uses it: the nonce is 32 bits
/// of zeros followed by the 64-bit counter in little-endian order.
public enum ChaChaPoly {
    public static let keyLength = 32
    public static let tagLength = 16

    static func nonce(_ n: UInt64) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 12)
        for i in 0..<8 { out[4 + i] = UInt8(truncatingIfNeeded: n >> (8 * UInt64(i))) }
        return out
    }

    public static func seal(key: SecureBytes, nonce n: UInt64, ad: [UInt8], plaintext: UnsafeRawBufferPointer) -> [UInt8] {
        requireSodium()
        var out = [UInt8](repeating: 0, count: plaintext.count + tagLength)
        var outLen: UInt64 = 0
        let nonceBytes = nonce(n)
        key.withUnsafeBytes { k in
            out.withUnsafeMutableBytes { o in
                _ = crypto_aead_chacha20poly1305_ietf_encrypt(
                    o.bindMemory(to: UInt8.self).baseAddress!, &outLen,
                    plaintext.bindMemory(to: UInt8.self).baseAddress, UInt64(plaintext.count),
                    ad, UInt64(ad.count), nil, nonceBytes, k.bindMemory(to: UInt8.self).baseAddress!)
            }
        }
        return out
    }

    /// Decrypts into secure memory: the plaintext may be a password.
    public static func open(key: SecureBytes, nonce n: UInt64, ad: [UInt8], ciphertext: UnsafeRawBufferPointer) throws(CryptoError) -> SecureBytes {
        requireSodium()
        guard ciphertext.count >= tagLength else { throw .authenticationFailed }
        let out = SecureBytes(count: ciphertext.count - tagLength)
        var outLen: UInt64 = 0
        let nonceBytes = nonce(n)
        let rc = key.withUnsafeBytes { k in
            out.withUnsafeMutableBytes { o in
                crypto_aead_chacha20poly1305_ietf_decrypt(
                    o.bindMemory(to: UInt8.self).baseAddress!, &outLen, nil,
                    ciphertext.bindMemory(to: UInt8.self).baseAddress!, UInt64(ciphertext.count),
                    ad, UInt64(ad.count), nonceBytes, k.bindMemory(to: UInt8.self).baseAddress!)
            }
        }
        guard rc == 0 else { throw .authenticationFailed }
        return out
    }
}

/// BLAKE2b (libsodium `crypto_generichash`), HASHLEN 64 and BLOCKLEN 128 as Noise section 12.8 uses.
public enum Blake2b {
    public static let hashLength = 64
    public static let blockLength = 128

    public static func hash(_ parts: [UInt8]..., outputLength: Int = hashLength) -> [UInt8] {
        hash(parts: parts.map { $0[...] }, outputLength: outputLength)
    }

    static func hash(parts: [ArraySlice<UInt8>], outputLength: Int = hashLength) -> [UInt8] {
        var stream = Blake2bStream(outputLength: outputLength)
        for part in parts { part.withUnsafeBytes { stream.update($0) } }
        var out = [UInt8](repeating: 0, count: outputLength)
        out.withUnsafeMutableBytes { stream.finish(into: $0) }
        return out
    }

    /// HMAC (RFC 2104) over BLAKE2b with the 128-byte block, as Noise section 4.3 defines HMAC-HASH.
    /// This is not BLAKE2b's keyed mode: Noise requires the HMAC construction.
    static func hmac(key: UnsafeRawBufferPointer, data: [UnsafeRawBufferPointer]) -> SecureBytes {
        precondition(key.count <= blockLength)
        var ipad = [UInt8](repeating: 0x36, count: blockLength)
        var opad = [UInt8](repeating: 0x5c, count: blockLength)
        for i in 0..<key.count { ipad[i] ^= key[i]; opad[i] ^= key[i] }
        defer { secureZero(&ipad); secureZero(&opad) }

        let inner = SecureBytes(count: hashLength)
        var stream = Blake2bStream(outputLength: hashLength)
        ipad.withUnsafeBytes { stream.update($0) }
        for d in data { stream.update(d) }
        inner.withUnsafeMutableBytes { stream.finish(into: $0) }

        let out = SecureBytes(count: hashLength)
        var outer = Blake2bStream(outputLength: hashLength)
        opad.withUnsafeBytes { outer.update($0) }
        inner.withUnsafeBytes { outer.update($0) }
        out.withUnsafeMutableBytes { outer.finish(into: $0) }
        return out
    }

    /// HKDF as Noise section 4.3 defines it: returns two or three HASHLEN outputs.
    public static func noiseHKDF(chainingKey: SecureBytes, inputKeyMaterial: UnsafeRawBufferPointer, outputs: Int) -> [SecureBytes] {
        precondition(outputs == 2 || outputs == 3)
        let tempKey = chainingKey.withUnsafeBytes { hmac(key: $0, data: [inputKeyMaterial]) }
        var results: [SecureBytes] = []
        var previous: SecureBytes? = nil
        for i in 1...outputs {
            var counter = [UInt8(i)]
            let next = tempKey.withUnsafeBytes { tk in
                counter.withUnsafeBytes { c in
                    if let previous {
                        return previous.withUnsafeBytes { p in hmac(key: tk, data: [p, c]) }
                    }
                    return hmac(key: tk, data: [c])
                }
            }
            secureZero(&counter)
            results.append(next)
            previous = next
        }
        return results
    }
}

/// Lower-case hex, for fingerprints, test vectors and logs of public values.
public func hex<C: Collection<UInt8>>(_ bytes: C) -> String {
    let digits: [Character] = Array("0123456789abcdef")
    var s = ""
    s.reserveCapacity(bytes.count * 2)
    for b in bytes { s.append(digits[Int(b >> 4)]); s.append(digits[Int(b & 0x0f)]) }
    return s
}

/// Parses hex (either case, no separators). Returns nil on any non-hex character or odd length.
public func unhex(_ string: String) -> [UInt8]? {
    let chars = Array(string.utf8)
    guard chars.count % 2 == 0 else { return nil }
    func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case 48...57: return c - 48
        case 97...102: return c - 87
        case 65...70: return c - 55
        default: return nil
        }
    }
    var out: [UInt8] = []
    out.reserveCapacity(chars.count / 2)
    var i = 0
    while i < chars.count {
        guard let hi = nibble(chars[i]), let lo = nibble(chars[i + 1]) else { return nil }
        out.append(hi << 4 | lo)
        i += 2
    }
    return out
}

/// Incremental BLAKE2b. libsodium's state struct is 64-byte aligned, which Swift imports as an
/// opaque type, so the state lives in aligned secure memory sized by `crypto_generichash_statebytes`.
struct Blake2bStream: ~Copyable {
    private let state: UnsafeMutableRawPointer
    private let size: Int
    private let outputLength: Int

    init(outputLength: Int) {
        requireSodium()
        size = crypto_generichash_statebytes()
        state = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 64)
        self.outputLength = outputLength
        crypto_generichash_init(OpaquePointer(state), nil, 0, outputLength)
    }

    mutating func update(_ data: UnsafeRawBufferPointer) {
        guard data.count > 0 else { return }
        crypto_generichash_update(OpaquePointer(state), data.bindMemory(to: UInt8.self).baseAddress, UInt64(data.count))
    }

    mutating func finish(into out: UnsafeMutableRawBufferPointer) {
        precondition(out.count == outputLength)
        crypto_generichash_final(OpaquePointer(state), out.bindMemory(to: UInt8.self).baseAddress!, outputLength)
    }

    deinit {
        sodium_memzero(state, size)
        state.deallocate()
    }
}

/// A seal on a file only its writer reads back (the box's fleet roster cache): HMAC-BLAKE2b
/// under a key derived from the writer's private key and the file's label. A file someone else
/// wrote or edited — whatever its owner and mode — or one copied from another box fails the check.
public enum FileSeal {
    public static let length = Blake2b.hashLength

    public static func seal(_ contents: [UInt8], key: SecureBytes, label: String) -> [UInt8] {
        let fileKey = key.withUnsafeBytes { k in Array(("boxkey file seal: " + label).utf8).withUnsafeBytes { Blake2b.hmac(key: k, data: [$0]) } }
        return fileKey.withUnsafeBytes { k in contents.withUnsafeBytes { Blake2b.hmac(key: k, data: [$0]).unprotectedCopy } }
    }

    public static func verify(_ seal: [UInt8], of contents: [UInt8], key: SecureBytes, label: String) -> Bool {
        let expected = Self.seal(contents, key: key, label: label)
        return expected.withUnsafeBytes { e in seal.withUnsafeBytes { constantTimeEqual(e, $0) } }
    }
}
