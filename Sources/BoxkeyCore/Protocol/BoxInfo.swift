/// The value of the Info characteristic (read, plaintext): what a phone needs to pair.
///
///     0      minimum protocol version the box speaks
///     1      maximum protocol version the box speaks
///     2..3   box ID, big-endian
///     4..35  box static public key (X25519)
///     36..   a fleet box only: its certificate, then the fleet's revocation list
///            (`BoxCertificate`, `BoxRevocationList`); a phone that trusts the fleet key
///            takes the box on that (docs/fleet.md)
///
/// Reading it costs a Read plus Read Blob requests at small MTUs; it is read once, at pairing.
/// The key is pinned only after the user compares its fingerprint with the one the box shows.
public struct BoxInfo: Equatable, Sendable {
    public static let length = 4 + PublicKey.length

    public var versions: ClosedRange<UInt8>
    public var boxID: BoxID
    public var staticKey: PublicKey
    /// The certificate and revocation list of a fleet box; empty otherwise.
    public var fleet: [UInt8]
    /// The most an Info may hold (one attribute value).
    public static let maxLength = 512

    public init(versions: ClosedRange<UInt8> = BoxkeyProtocol.supportedVersions, boxID: BoxID, staticKey: PublicKey, fleet: [UInt8] = []) {
        self.versions = versions
        self.boxID = boxID
        self.staticKey = staticKey
        self.fleet = fleet
    }

    public enum DecodeError: Error, Equatable, Sendable {
        case wrongLength(Int)
        case invalidVersionRange
        case invalidBoxID(UInt16)
    }

    public func encode() -> [UInt8] {
        [versions.lowerBound, versions.upperBound, UInt8(boxID.value >> 8), UInt8(boxID.value & 0xff)] + staticKey.bytes + fleet
    }

    public static func decode(_ bytes: [UInt8]) throws(DecodeError) -> BoxInfo {
        guard bytes.count >= length, bytes.count <= maxLength else { throw .wrongLength(bytes.count) }
        guard bytes[0] <= bytes[1] else { throw .invalidVersionRange }
        let raw = UInt16(bytes[2]) << 8 | UInt16(bytes[3])
        guard let id = BoxID(raw) else { throw .invalidBoxID(raw) }
        return BoxInfo(versions: bytes[0]...bytes[1], boxID: id, staticKey: try! PublicKey(bytes[4..<length]), fleet: Array(bytes[length...]))
    }
}
