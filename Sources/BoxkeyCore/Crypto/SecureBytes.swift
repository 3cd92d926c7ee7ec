import CSodium
import Glibc

/// A fixed-size buffer for keys and secrets, in libsodium secure memory: `mlock`ed so it is not
/// swapped out, excluded from core dumps (`MADV_DONTDUMP`), behind guard pages, and wiped when
/// the last reference goes away. Secrets of up to `SecureSlab.slotSize` bytes (keys, hashes,
/// chaining keys: nearly all) share slabs; larger ones get a `sodium_malloc` of their own.
///
/// The buffer is written only while it is being built (inside this module); after that it is
/// read-only, which is what makes the `Sendable` conformance sound.
public final class SecureBytes: @unchecked Sendable {
    public let count: Int
    private let pointer: UnsafeMutableRawPointer
    private let inSlab: Bool

    /// A zero-filled buffer of `count` bytes.
    public init(count: Int) {
        requireSodium()
        if let p = SecureSlab.allocate(count) {
            pointer = p
            inSlab = true
        } else {
            // sodium_malloc(0) is legal but returns a pointer we must not touch; keep at least one byte.
            guard let p = sodium_malloc(max(count, 1)) else {
                fatalError("sodium_malloc failed: secure memory exhausted")
            }
            pointer = p
            inSlab = false
        }
        sodium_memzero(pointer, max(count, 1))
        self.count = count
    }

    /// Copies `bytes` into secure memory. The caller remains responsible for wiping its copy.
    public convenience init(copying bytes: UnsafeRawBufferPointer) {
        self.init(count: bytes.count)
        if bytes.count > 0 { pointer.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
    }

    public convenience init(copying bytes: [UInt8]) {
        self.init(count: bytes.count)
        bytes.withUnsafeBytes { if $0.count > 0 { pointer.copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
    }

    /// Takes the bytes of a UTF-8 string (for a password typed by the user).
    public convenience init(utf8 string: String) {
        var bytes = Array(string.utf8)
        self.init(copying: bytes)
        secureZero(&bytes)
    }

    /// A buffer filled by `body`, which sees the memory once, while it is being built.
    public convenience init(count: Int, initializingWith body: (UnsafeMutableRawBufferPointer) -> Void) {
        self.init(count: count)
        body(UnsafeMutableRawBufferPointer(start: pointer, count: count))
    }

    /// `count` random bytes generated directly into secure memory.
    public static func random(count: Int) -> SecureBytes {
        let s = SecureBytes(count: count)
        randombytes_buf(s.pointer, count)
        return s
    }

    deinit {
        if inSlab { SecureSlab.release(pointer) } else { sodium_free(pointer) }
    }

    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: pointer, count: count))
    }

    /// Write access, for filling the buffer right after allocation. Internal to keep the
    /// read-only-after-construction contract.
    func withUnsafeMutableBytes<R, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeMutableRawBufferPointer(start: pointer, count: count))
    }

    /// A new buffer holding the first `length` bytes.
    public func prefix(_ length: Int) -> SecureBytes {
        precondition(length <= count)
        return withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0.prefix(length))) }
    }

    /// The bytes as an ordinary array. Only for values that are not secret (public keys,
    /// ciphertext) or for tests; the caller must wipe the copy if it is secret.
    public var unprotectedCopy: [UInt8] {
        withUnsafeBytes { Array($0) }
    }

    /// Constant-time equality.
    public func isEqual(to other: SecureBytes) -> Bool {
        withUnsafeBytes { a in other.withUnsafeBytes { b in constantTimeEqual(a, b) } }
    }
}

extension SecureBytes: CustomStringConvertible, CustomDebugStringConvertible {
    // Never print the contents: this type exists to keep them out of logs.
    public var description: String { "SecureBytes(\(count) bytes, redacted)" }
    public var debugDescription: String { description }
}

/// Slots for small secrets, carved from `sodium_malloc`ed chunks.
///
/// A `sodium_malloc` per key costs about nine system calls (mmap, mprotect for the guard pages,
/// mlock, madvise, and as many to free it); a Noise handshake makes dozens of short-lived keys,
/// which made the box's handshake cost over a millisecond of CPU. Slots keep what matters, locked
/// and out of core dumps and wiped on release, and give up only the guard pages between two
/// secrets (each chunk still has its own). Chunks are kept for reuse, never returned.
enum SecureSlab {
    static let slotSize = 128
    static let slotsPerChunk = 256

    nonisolated(unsafe) private static let lock: UnsafeMutablePointer<pthread_mutex_t> = {
        let m = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        pthread_mutex_init(m, nil)
        return m
    }()
    nonisolated(unsafe) private static var free: [UnsafeMutableRawPointer] = []

    /// A slot for `count` bytes, or nil when it does not fit one.
    static func allocate(_ count: Int) -> UnsafeMutableRawPointer? {
        guard count <= slotSize else { return nil }
        pthread_mutex_lock(lock)
        defer { pthread_mutex_unlock(lock) }
        if free.isEmpty {
            guard let chunk = sodium_malloc(slotSize * slotsPerChunk) else {
                fatalError("sodium_malloc failed: secure memory exhausted")
            }
            free.reserveCapacity(slotsPerChunk)
            for i in (0..<slotsPerChunk).reversed() { free.append(chunk + i * slotSize) }
        }
        return free.removeLast()
    }

    /// Wipes the slot and makes it available again.
    static func release(_ slot: UnsafeMutableRawPointer) {
        sodium_memzero(slot, slotSize)
        pthread_mutex_lock(lock)
        free.append(slot)
        pthread_mutex_unlock(lock)
    }
}
