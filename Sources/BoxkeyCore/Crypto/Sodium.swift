import CSodium

/// libsodium must be initialised once before any other call; `sodium_init` is idempotent and
/// thread-safe, and a global `let` runs it exactly once.
let sodiumReady: Bool = sodium_init() >= 0

@inline(__always)
func requireSodium() {
    precondition(sodiumReady, "libsodium failed to initialise")
}

/// Errors from the cryptographic layer. None of them carries key or plaintext material.
public enum CryptoError: Error, Equatable, Sendable {
    /// AEAD tag did not verify: wrong key, tampered ciphertext, or replayed nonce.
    case authenticationFailed
    /// An X25519 result was all zeros: the peer sent a low-order point.
    case weakPublicKey
    /// An input had the wrong length for the primitive.
    case invalidLength(expected: Int, actual: Int)
    /// `sodium_malloc` failed (the secure-memory limit is reached).
    case secureMemoryExhausted
}

/// Random bytes from the operating system's CSPRNG (libsodium `randombytes_buf`).
public enum SystemRandom {
    public static func bytes(_ count: Int) -> [UInt8] {
        requireSodium()
        var out = [UInt8](repeating: 0, count: count)
        out.withUnsafeMutableBytes { randombytes_buf($0.baseAddress!, $0.count) }
        return out
    }

    public static func uniform(_ upperBound: UInt32) -> UInt32 {
        requireSodium()
        return randombytes_uniform(upperBound)
    }
}

/// Overwrites a Swift array in place. Used on temporary copies of secrets that had to pass
/// through ordinary memory (for example a decoded frame before it is split into fields).
public func secureZero(_ bytes: inout [UInt8]) {
    bytes.withUnsafeMutableBytes { if $0.count > 0 { sodium_memzero($0.baseAddress!, $0.count) } }
}

/// Constant-time comparison of two byte buffers of equal length.
public func constantTimeEqual(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
    guard a.count == b.count else { return false }
    if a.count == 0 { return true }
    return sodium_memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0
}

extension Array where Element == UInt8 {
    /// `withUnsafeBytes` with typed throws (the standard library's is untyped `rethrows`).
    @inlinable
    public func withBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        let result: Result<R, E> = withUnsafeBytes { pointer in
            do throws(E) { return .success(try body(pointer)) } catch { return .failure(error) }
        }
        return try result.get()
    }
}

/// Standard base64 (with padding), through libsodium: how certificates and revocation lists
/// travel as text (command lines, files, directory attributes).
public func base64Encode(_ bytes: [UInt8]) -> String {
    requireSodium()
    let variant = Int32(sodium_base64_VARIANT_ORIGINAL)
    var out = [CChar](repeating: 0, count: sodium_base64_encoded_len(bytes.count, variant))
    _ = sodium_bin2base64(&out, out.count, bytes, bytes.count, variant)
    return String(decoding: out.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// Decodes standard base64 (whitespace around it ignored); nil if it is not base64.
public func base64Decode(_ text: String) -> [UInt8]? {
    requireSodium()
    let trimmed = Array(text.utf8.drop { $0 == 0x20 || $0 == 0x0a || $0 == 0x0d || $0 == 0x09 }.reversed()
        .drop { $0 == 0x20 || $0 == 0x0a || $0 == 0x0d || $0 == 0x09 }.reversed())
    var out = [UInt8](repeating: 0, count: trimmed.count)
    var length = 0
    let rc = trimmed.withUnsafeBufferPointer { p in
        p.withMemoryRebound(to: CChar.self) { c in
            sodium_base642bin(&out, out.count, c.baseAddress, trimmed.count, nil, &length, nil, Int32(sodium_base64_VARIANT_ORIGINAL))
        }
    }
    guard rc == 0 else { return nil }
    return Array(out.prefix(length))
}
