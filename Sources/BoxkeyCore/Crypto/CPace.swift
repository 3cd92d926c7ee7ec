import CSodium

/// CPace, a balanced PAKE (after draft-irtf-cfrg-cpace, on ristretto255 with BLAKE2b-512 as the
/// hash; not byte-compatible with the draft's SHA-512 test vectors). It turns the six-digit
/// pairing code into a 32-byte key that the two sides share only if they used the same code.
///
/// Why a PAKE and not the code itself as the Noise PSK: whichever side first sends something
/// keyed by a low-entropy PSK gives the other side an offline dictionary — 10^6 codes take a
/// second to try. With IKpsk2 alone a fake phone could brute-force the code from the box's
/// message 2, and with IKpsk1 a fake box could brute-force it from the phone's message 1.
/// Through CPace each protocol run tests exactly one code guess against a live peer, on either
/// side, and an eavesdropper learns nothing about the code (its shares are uniformly random
/// group elements, and the Noise DH secrets hide everything after them).
///
///     G   = ristretto255_from_hash(BLAKE2b-512(lv(DSI) | lv(code) | lv(context)))
///     Ya  = ya·G (phone)        Yb = yb·G (box)        K = ya·Yb = yb·Ya
///     psk = BLAKE2b-256(lv(DSI-ISK) | lv(context) | lv(K) | lv(Ya) | lv(Yb))
///
/// `lv(x)` is a one-byte length then x. The context binds the protocol version, box ID,
/// advertisement nonce and both static keys, so a code works only for this pair of keys.
public enum CPace {
    public static let shareLength = 32
    public static let keyLength = 32
    static let generatorDomain = Array("Boxkey-CPace-ristretto255-BLAKE2b".utf8)
    static let keyDomain = Array("Boxkey-CPace-ISK".utf8)

    public enum Failure: Error, Equatable, Sendable {
        /// The peer's share is not a valid ristretto255 encoding, or the result is the identity.
        case invalidShare
    }

    /// One side's ephemeral scalar and the share it sends.
    public struct Party: Sendable {
        let scalar: SecureBytes
        public let share: [UInt8]
    }

    /// Picks a fresh scalar and computes the share for `code` in `context`.
    public static func start(code: [UInt8], context: [UInt8]) -> Party {
        requireSodium()
        let generator = generator(code: code, context: context)
        let scalar = SecureBytes(count: 32) { crypto_core_ristretto255_scalar_random(u8($0.baseAddress!)) }
        var share = [UInt8](repeating: 0, count: shareLength)
        let rc = share.withUnsafeMutableBytes { s in
            scalar.withUnsafeBytes { k in generator.withUnsafeBytes { g in
                crypto_scalarmult_ristretto255(u8(s.baseAddress!), u8c(k.baseAddress!), u8c(g.baseAddress!))
            } }
        }
        // The generator is a hash to the group and the scalar is random: never the identity.
        precondition(rc == 0, "CPace share is the identity")
        return Party(scalar: scalar, share: share)
    }

    /// The shared key from our party and the peer's share. `initiatorShare` and
    /// `responderShare` are both shares in protocol order (phone first).
    public static func finish(_ party: Party, peerShare: [UInt8], context: [UInt8],
                              initiatorShare: [UInt8], responderShare: [UInt8]) throws(Failure) -> SecureBytes {
        guard peerShare.count == shareLength, crypto_core_ristretto255_is_valid_point(peerShare) == 1 else { throw .invalidShare }
        let k = SecureBytes(count: 32)
        let rc = k.withUnsafeMutableBytes { o in
            party.scalar.withUnsafeBytes { s in peerShare.withUnsafeBytes { p in
                crypto_scalarmult_ristretto255(u8(o.baseAddress!), u8c(s.baseAddress!), u8c(p.baseAddress!))
            } }
        }
        guard rc == 0 else { throw .invalidShare }
        var stream = Blake2bStream(outputLength: keyLength)
        for part in [keyDomain, context] { lv(part) { stream.update($0) } }
        k.withUnsafeBytes { kb in
            withUnsafeBytes(of: UInt8(kb.count)) { stream.update($0) }
            stream.update(kb)
        }
        for part in [initiatorShare, responderShare] { lv(part) { stream.update($0) } }
        return SecureBytes(count: keyLength) { stream.finish(into: $0) }
    }

    static func generator(code: [UInt8], context: [UInt8]) -> [UInt8] {
        var stream = Blake2bStream(outputLength: 64)
        for part in [generatorDomain, code, context] { lv(part) { stream.update($0) } }
        var digest = [UInt8](repeating: 0, count: 64)
        digest.withUnsafeMutableBytes { stream.finish(into: $0) }
        defer { secureZero(&digest) }
        var point = [UInt8](repeating: 0, count: 32)
        point.withUnsafeMutableBytes { p in digest.withUnsafeBytes { d in
            _ = crypto_core_ristretto255_from_hash(u8(p.baseAddress!), u8c(d.baseAddress!))
        } }
        return point
    }

    private static func u8(_ p: UnsafeMutableRawPointer) -> UnsafeMutablePointer<UInt8> { p.assumingMemoryBound(to: UInt8.self) }
    private static func u8c(_ p: UnsafeRawPointer) -> UnsafePointer<UInt8> { p.assumingMemoryBound(to: UInt8.self) }

    private static func lv(_ bytes: [UInt8], _ body: (UnsafeRawBufferPointer) -> Void) {
        precondition(bytes.count < 256)
        withUnsafeBytes(of: UInt8(bytes.count)) { body($0) }
        bytes.withUnsafeBytes { body($0) }
    }
}

/// The one-time pairing code the box shows on its own screen: six decimal digits, uniformly
/// random. Typed into the phone, it proves the person stands at this box.
public struct PairingCode: Equatable, Sendable, CustomStringConvertible {
    public static let digits = 6
    public let text: String

    /// Accepts the digits with any spaces or dashes a person types between them.
    public init?(_ typed: String) {
        let kept = typed.filter { $0 != " " && $0 != "-" }
        guard kept.count == Self.digits, kept.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        text = kept
    }

    public static func random() -> PairingCode {
        var n = SystemRandom.uniform(1_000_000)
        var s = ""
        for _ in 0..<digits { s = String(n % 10) + s; n /= 10 }
        return PairingCode(s)!
    }

    public var bytes: [UInt8] { Array(text.utf8) }
    public var description: String { text }
}
