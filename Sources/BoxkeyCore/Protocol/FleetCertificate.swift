/// A box certified by the fleet key: a phone that trusts the fleet key once takes a new box of
/// the fleet without pinning it (docs/fleet.md). Binary, big-endian, signed with Ed25519:
///
///     0        version (1)
///     1..32    the box's static public key (X25519: the key the Noise handshake proves)
///     33..34   the box ID
///     35..42   serial number (random; what a revocation list names)
///     43..50   not before (Unix seconds)
///     51..58   not after (Unix seconds)
///     59..122  signature over "boxkey box certificate v1\0" + bytes 0..58
public struct BoxCertificate: Sendable, Equatable {
    public static let length = 59 + Ed25519.signatureLength
    static let domain = Array("boxkey box certificate v1\u{0}".utf8)

    public var boxKey: PublicKey
    public var boxID: BoxID
    public var serial: UInt64
    public var notBefore: Int64
    public var notAfter: Int64
    public var signature: [UInt8]

    public enum DecodeError: Error, Equatable, Sendable { case wrongLength(Int), unknownVersion(UInt8), invalidBoxID(UInt16) }

    /// Signs a certificate for `boxKey` as box `boxID`, valid from `notBefore` to `notAfter`.
    public static func issue(boxKey: PublicKey, boxID: BoxID, serial: UInt64, notBefore: Int64, notAfter: Int64,
                             by fleet: Ed25519.KeyPair) -> BoxCertificate {
        var c = BoxCertificate(boxKey: boxKey, boxID: boxID, serial: serial, notBefore: notBefore, notAfter: notAfter, signature: [])
        c.signature = fleet.sign(domain + c.signed)
        return c
    }

    var signed: [UInt8] {
        [1] + boxKey.bytes + [UInt8(boxID.value >> 8), UInt8(boxID.value & 0xff)] + bigEndian(serial) + bigEndian(UInt64(bitPattern: notBefore)) + bigEndian(UInt64(bitPattern: notAfter))
    }

    public func encode() -> [UInt8] { signed + signature }

    public static func decode(_ bytes: some Collection<UInt8>) throws(DecodeError) -> BoxCertificate {
        let b = Array(bytes)
        guard b.count == length else { throw .wrongLength(b.count) }
        guard b[0] == 1 else { throw .unknownVersion(b[0]) }
        let raw = UInt16(b[33]) << 8 | UInt16(b[34])
        guard let id = BoxID(raw) else { throw .invalidBoxID(raw) }
        return BoxCertificate(boxKey: try! PublicKey(b[1...32]), boxID: id, serial: readBigEndian(b[35...42]),
                              notBefore: Int64(bitPattern: readBigEndian(b[43...50])), notAfter: Int64(bitPattern: readBigEndian(b[51...58])),
                              signature: Array(b[59...]))
    }

    public func isSigned(by fleet: Ed25519.PublicKey) -> Bool { fleet.verify(signature, of: Self.domain + signed) }
}

/// The fleet's revoked box certificates, signed by the fleet key, with a number that only grows
/// and a date by which the next list must be out. Boxes read it from the directory and serve it
/// with their certificate; a phone refuses a box that serves no current list, a list older than
/// one it has seen, or a list that names the box's certificate. A revoked certificate may leave
/// the list once it has expired.
///
///     0        version (1)
///     1..8     number
///     9..16    issued (Unix seconds)
///     17..24   next update: the list is not current after this (Unix seconds)
///     25       count (at most `maxSerials`)
///     26..     serials, 8 bytes each
///     then     signature over "boxkey box revocations v1\0" + everything before it
public struct BoxRevocationList: Sendable, Equatable {
    /// Keeps Info, certificate and list within one attribute value (512 bytes).
    public static let maxSerials = 32
    static let domain = Array("boxkey box revocations v1\u{0}".utf8)
    static let headerLength = 26

    public var number: UInt64
    public var issued: Int64
    public var nextUpdate: Int64
    public var serials: [UInt64]
    public var signature: [UInt8]

    public enum DecodeError: Error, Equatable, Sendable { case wrongLength(Int), unknownVersion(UInt8), tooManySerials(Int) }

    public static func issue(number: UInt64, issued: Int64, nextUpdate: Int64, serials: [UInt64], by fleet: Ed25519.KeyPair) throws(DecodeError) -> BoxRevocationList {
        guard serials.count <= maxSerials else { throw .tooManySerials(serials.count) }
        var l = BoxRevocationList(number: number, issued: issued, nextUpdate: nextUpdate, serials: serials, signature: [])
        l.signature = fleet.sign(domain + l.signed)
        return l
    }

    var signed: [UInt8] {
        [1] + bigEndian(number) + bigEndian(UInt64(bitPattern: issued)) + bigEndian(UInt64(bitPattern: nextUpdate)) + [UInt8(serials.count)]
            + serials.flatMap(bigEndian)
    }

    public func encode() -> [UInt8] { signed + signature }

    public static func decode(_ bytes: some Collection<UInt8>) throws(DecodeError) -> BoxRevocationList {
        let b = Array(bytes)
        guard b.count >= headerLength + Ed25519.signatureLength else { throw .wrongLength(b.count) }
        guard b[0] == 1 else { throw .unknownVersion(b[0]) }
        let count = Int(b[25])
        guard count <= maxSerials else { throw .tooManySerials(count) }
        guard b.count == headerLength + 8 * count + Ed25519.signatureLength else { throw .wrongLength(b.count) }
        let serials = (0..<count).map { i in readBigEndian(b[(headerLength + 8 * i)..<(headerLength + 8 * i + 8)]) }
        return BoxRevocationList(number: readBigEndian(b[1...8]), issued: Int64(bitPattern: readBigEndian(b[9...16])),
                                 nextUpdate: Int64(bitPattern: readBigEndian(b[17...24])), serials: serials,
                                 signature: Array(b[(headerLength + 8 * count)...]))
    }

    public func isSigned(by fleet: Ed25519.PublicKey) -> Bool { fleet.verify(signature, of: Self.domain + signed) }
}

/// The phone's check of a box it has not pinned, from what the box's Info carries: a
/// certificate by a fleet key the phone trusts, for this box ID and the key the handshake will
/// prove, valid now, and a current revocation list by the same key, no older than the newest
/// the phone has seen, that does not name it. Pure: the caller keeps the newest list number.
public enum FleetCheck {
    public enum Refusal: Error, Equatable, Sendable, CustomStringConvertible {
        case noCertificate
        case notByATrustedFleetKey
        case otherBox(BoxID)
        case otherKey
        case notYetValid(Int64)
        case expired(Int64)
        case noCurrentRevocationList
        case revocationListExpired(Int64)
        case olderRevocationList(seen: UInt64, served: UInt64)
        case revoked(serial: UInt64)

        public var description: String {
            switch self {
            case .noCertificate: "it has no fleet certificate"
            case .notByATrustedFleetKey: "its certificate is not signed by a fleet key this phone trusts"
            case .otherBox(let id): "its certificate is for box \(id)"
            case .otherKey: "its certificate is for another box key"
            case .notYetValid(let t): "its certificate is not valid before \(t) (Unix time; is this phone's clock right?)"
            case .expired(let t): "its certificate expired at \(t) (Unix time); the fleet's admin must certify it again"
            case .noCurrentRevocationList: "it serves no revocation list of the fleet"
            case .revocationListExpired(let t): "the fleet's revocation list it serves expired at \(t) (Unix time): the box cannot read the directory, or the admin has not signed a new list"
            case .olderRevocationList(let seen, let served): "it serves revocation list \(served), older than list \(seen) this phone has seen"
            case .revoked(let serial): "its certificate (serial \(String(serial, radix: 16))) was revoked by the fleet"
            }
        }
    }

    /// The revocation list in a box's Info, if a trusted fleet key signed it (with that key),
    /// whatever else is wrong with the box: a phone keeps the newest it has seen.
    public static func revocationList(in fleetPart: [UInt8], trusted: [Ed25519.PublicKey]) -> (BoxRevocationList, Ed25519.PublicKey)? {
        guard fleetPart.count > BoxCertificate.length, let list = try? BoxRevocationList.decode(fleetPart.dropFirst(BoxCertificate.length)),
              let key = trusted.first(where: { list.isSigned(by: $0) }) else { return nil }
        return (list, key)
    }

    /// Verifies the fleet part of a box's Info; returns the certificate and the list (for the
    /// caller to remember the list's number under the fleet key that signed it).
    public static func verify(_ fleetPart: [UInt8], boxID: BoxID, boxKey: PublicKey, trusted: [Ed25519.PublicKey],
                              newestSeen: (Ed25519.PublicKey) -> UInt64, now: Int64) throws(Refusal) -> (BoxCertificate, BoxRevocationList, Ed25519.PublicKey) {
        guard fleetPart.count >= BoxCertificate.length, let cert = try? BoxCertificate.decode(fleetPart.prefix(BoxCertificate.length)) else { throw .noCertificate }
        guard let fleet = trusted.first(where: { cert.isSigned(by: $0) }) else { throw .notByATrustedFleetKey }
        guard cert.boxID == boxID else { throw .otherBox(cert.boxID) }
        guard cert.boxKey == boxKey else { throw .otherKey }
        // Five minutes of clock skew either way.
        guard now + 300 >= cert.notBefore else { throw .notYetValid(cert.notBefore) }
        guard now - 300 <= cert.notAfter else { throw .expired(cert.notAfter) }
        guard let list = try? BoxRevocationList.decode(fleetPart.dropFirst(BoxCertificate.length)), list.isSigned(by: fleet) else {
            throw .noCurrentRevocationList
        }
        guard now <= list.nextUpdate else { throw .revocationListExpired(list.nextUpdate) }
        let seen = newestSeen(fleet)
        guard list.number >= seen else { throw .olderRevocationList(seen: seen, served: list.number) }
        guard !list.serials.contains(cert.serial) else { throw .revoked(serial: cert.serial) }
        return (cert, list, fleet)
    }
}

func bigEndian(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * $0)) } }
func readBigEndian(_ b: some Collection<UInt8>) -> UInt64 { b.reduce(0) { $0 << 8 | UInt64($1) } }
