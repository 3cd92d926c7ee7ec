/// Every reassembled message is an envelope:
///
///     0     protocol version
///     1     kind
///     2...  body, whose length is fixed by the kind (see `Envelope.Kind`)
///
/// The envelope header is plaintext; the protocol version is also bound into the Noise
/// prologue, so an attacker who rewrites it only makes the handshake fail.
public enum Envelope: Equatable, Sendable {
    /// Phone to box: the advertisement nonce the phone heard, then Noise IK message 1.
    case handshakeInit(advertisementNonce: UInt16, noise: [UInt8])
    /// Box to phone: Noise IK message 2.
    case handshakeResponse(noise: [UInt8])
    /// Either way, after the handshake: a Noise transport message holding one `AppMessage`.
    case sealed([UInt8])
    /// Box to phone, before a channel exists: why the box will not talk. Unauthenticated, so a
    /// phone treats it as a hint (it never changes pinned keys or wipes anything because of one).
    case refusal(Refusal)
    /// Phone to box, pairing: the advertisement nonce, the phone's CPace share, then Noise
    /// IKpsk2 message 1.
    case pairingInit(advertisementNonce: UInt16, share: [UInt8], noise: [UInt8])
    /// Box to phone, pairing: the box's CPace share, then Noise IKpsk2 message 2.
    case pairingResponse(share: [UInt8], noise: [UInt8])

    public enum Kind: UInt8, Sendable {
        case handshakeInit = 0x01
        case handshakeResponse = 0x02
        case sealed = 0x03
        case refusal = 0x04
        case pairingInit = 0x05
        case pairingResponse = 0x06
    }

    public static let headerLength = 2
    /// Largest envelope either side accepts. A credential push at its field limits is 697 bytes
    /// (see `CredentialPush.maxEncodedLength`); the rest is headroom for later versions.
    public static let maxLength = 1024

    public static let handshakeInitLength = headerLength + 2 + NoiseIK.message1Length     // 100
    public static let handshakeResponseLength = headerLength + NoiseIK.message2Length      // 50
    public static let refusalLength = headerLength + 3                                      // 5
    public static let pairingInitLength = headerLength + 2 + CPace.shareLength + NoiseIK.message1Length   // 132
    public static let pairingResponseLength = headerLength + CPace.shareLength + NoiseIK.message2Length   // 82
    public static let minSealedLength = headerLength + NoiseIK.transportOverhead + 1        // 19

    public enum DecodeError: Error, Equatable, Sendable {
        case tooShort(Int)
        case tooLong(Int)
        case unsupportedVersion(UInt8)
        case unknownKind(UInt8)
        case wrongLength(kind: UInt8, expected: Int, actual: Int)
    }

    public func encode(version: UInt8 = BoxkeyProtocol.version) -> [UInt8] {
        switch self {
        case .handshakeInit(let nonce, let noise):
            return [version, Kind.handshakeInit.rawValue, UInt8(nonce >> 8), UInt8(nonce & 0xff)] + noise
        case .handshakeResponse(let noise):
            return [version, Kind.handshakeResponse.rawValue] + noise
        case .sealed(let ciphertext):
            return [version, Kind.sealed.rawValue] + ciphertext
        case .refusal(let refusal):
            return [version, Kind.refusal.rawValue] + refusal.encode()
        case .pairingInit(let nonce, let share, let noise):
            return [version, Kind.pairingInit.rawValue, UInt8(nonce >> 8), UInt8(nonce & 0xff)] + share + noise
        case .pairingResponse(let share, let noise):
            return [version, Kind.pairingResponse.rawValue] + share + noise
        }
    }

    /// Exact-length decoding: every kind has a fixed length or a bounded range, and anything
    /// else is an error. A refusal is decoded whatever its version, because its layout is frozen
    /// across versions: that is how a phone learns the box speaks another version.
    public static func decode(_ bytes: [UInt8]) throws(DecodeError) -> Envelope {
        guard bytes.count >= headerLength else { throw .tooShort(bytes.count) }
        guard bytes.count <= maxLength else { throw .tooLong(bytes.count) }
        let version = bytes[0]
        guard let kind = Kind(rawValue: bytes[1]) else {
            if !BoxkeyProtocol.supportedVersions.contains(version) { throw .unsupportedVersion(version) }
            throw .unknownKind(bytes[1])
        }
        if kind != .refusal, !BoxkeyProtocol.supportedVersions.contains(version) {
            throw .unsupportedVersion(version)
        }
        func require(_ length: Int) throws(DecodeError) {
            guard bytes.count == length else { throw .wrongLength(kind: kind.rawValue, expected: length, actual: bytes.count) }
        }
        switch kind {
        case .handshakeInit:
            try require(handshakeInitLength)
            return .handshakeInit(advertisementNonce: UInt16(bytes[2]) << 8 | UInt16(bytes[3]), noise: Array(bytes[4...]))
        case .handshakeResponse:
            try require(handshakeResponseLength)
            return .handshakeResponse(noise: Array(bytes[2...]))
        case .sealed:
            guard bytes.count >= minSealedLength else {
                throw .wrongLength(kind: kind.rawValue, expected: minSealedLength, actual: bytes.count)
            }
            return .sealed(Array(bytes[2...]))
        case .refusal:
            try require(refusalLength)
            guard let refusal = Refusal.decode(Array(bytes[2...])) else {
                throw .wrongLength(kind: kind.rawValue, expected: refusalLength, actual: bytes.count)
            }
            return .refusal(refusal)
        case .pairingInit:
            try require(pairingInitLength)
            let shareEnd = 4 + CPace.shareLength
            return .pairingInit(advertisementNonce: UInt16(bytes[2]) << 8 | UInt16(bytes[3]),
                                share: Array(bytes[4..<shareEnd]), noise: Array(bytes[shareEnd...]))
        case .pairingResponse:
            try require(pairingResponseLength)
            let shareEnd = 2 + CPace.shareLength
            return .pairingResponse(share: Array(bytes[2..<shareEnd]), noise: Array(bytes[shareEnd...]))
        }
    }
}

/// Why a box refuses a connection before (or instead of) completing a handshake.
///
///     0  code
///     1  lowest protocol version the box speaks
///     2  highest protocol version the box speaks
public struct Refusal: Equatable, Sendable, Error {
    public enum Code: UInt8, Sendable, CaseIterable {
        /// The envelope's version is not one the box speaks; bytes 1-2 say which it does.
        case unsupportedVersion = 0x01
        /// The advertisement nonce is not current: scan again and retry.
        case staleAdvertisement = 0x02
        /// Message 1 did not decrypt: the phone pinned another key for this box ID.
        case handshakeFailed = 0x03
        /// This handshake was seen before.
        case replayedHandshake = 0x04
        /// Too many failures recently, from this phone or overall; retry later.
        case rateLimited = 0x05
        /// The box's connection limit is reached.
        case busy = 0x06
        /// An administrator revoked this phone on this box.
        case phoneRevoked = 0x07
        /// A frame or envelope could not be decoded.
        case malformed = 0x08
        /// The phone took too long; the box dropped the exchange.
        case timedOut = 0x09
        /// The phone's key is not enrolled at this box: pair at the box with its code.
        case notEnrolled = 0x0a
        /// A pairing handshake, but the box shows no live pairing code (expired, used, or
        /// out of tries).
        case noPairingCode = 0x0b
        /// Any code this build does not know (from a newer box).
        case unknown = 0xff
    }

    public var code: Code
    public var versions: ClosedRange<UInt8>

    public init(_ code: Code, versions: ClosedRange<UInt8> = BoxkeyProtocol.supportedVersions) {
        self.code = code
        self.versions = versions
    }

    func encode() -> [UInt8] { [code.rawValue, versions.lowerBound, versions.upperBound] }

    static func decode(_ bytes: [UInt8]) -> Refusal? {
        guard bytes.count == 3, bytes[1] <= bytes[2] else { return nil }
        return Refusal(Code(rawValue: bytes[0]) ?? .unknown, versions: bytes[1]...bytes[2])
    }
}

extension Refusal.Code: CustomStringConvertible {
    /// In words, for the journal and the phone's fallback text.
    public var description: String {
        switch self {
        case .unsupportedVersion: "another protocol version"
        case .staleAdvertisement: "an advertisement that is no longer current"
        case .handshakeFailed: "a handshake that did not decrypt (a key the box does not hold)"
        case .replayedHandshake: "a replayed handshake"
        case .rateLimited: "too many failures, wait"
        case .busy: "the box is full"
        case .phoneRevoked: "a revoked phone"
        case .malformed: "a malformed message"
        case .timedOut: "too slow"
        case .notEnrolled: "a phone not enrolled here"
        case .noPairingCode: "no pairing code live"
        case .unknown: "a refusal this build does not know"
        }
    }
}
