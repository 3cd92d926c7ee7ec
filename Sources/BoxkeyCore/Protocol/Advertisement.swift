/// The box's advertisement: what a phone learns without connecting.
///
/// Legacy advertising PDUs carry 31 bytes of AD structures (Core spec Vol 3 Part C 11). Boxkey
/// uses all 31:
///
///     Flags                            3  (len, 0x01, 0x06: LE General Discoverable, no BR/EDR)
///     Complete 128-bit service UUIDs  18  (len, 0x07, UUID little-endian)
///     Manufacturer specific data      10  (len, 0xFF, company ID LE, 6-byte payload below)
///
/// Payload (6 bytes):
///
///     0     version (high nibble) | flags (low nibble)
///     1..2  box ID, big-endian, 0...9999
///     3..4  advertisement nonce, big-endian; rotates on a schedule and is bound into the
///           Noise prologue, so a handshake proves the phone heard a recent advertisement
///     5     key hint: first byte of BLAKE2b-256(box static key)
public struct Advertisement: Equatable, Sendable {
    public static let payloadLength = 6
    public static let legacyAdvertisingDataLength = 31

    public struct Flags: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue & 0x0f }
        /// A PAM stack on the box is waiting for a push right now.
        public static let loginPromptWaiting = Flags(rawValue: 1 << 0)
        /// The box has a live session that a phone holds as its presence link.
        public static let sessionActive = Flags(rawValue: 1 << 1)
    }

    public var version: UInt8
    public var flags: Flags
    public var boxID: BoxID
    public var nonce: UInt16
    public var keyHint: UInt8

    public init(version: UInt8 = BoxkeyProtocol.version, flags: Flags = [], boxID: BoxID, nonce: UInt16, keyHint: UInt8) {
        self.version = version
        self.flags = flags
        self.boxID = boxID
        self.nonce = nonce
        self.keyHint = keyHint
    }

    public enum DecodeError: Error, Equatable, Sendable {
        case wrongLength(Int)
        case unsupportedVersion(UInt8)
        case invalidBoxID(UInt16)
    }

    public func encode() -> [UInt8] {
        [version << 4 | flags.rawValue,
         UInt8(boxID.value >> 8), UInt8(boxID.value & 0xff),
         UInt8(nonce >> 8), UInt8(nonce & 0xff),
         keyHint]
    }

    /// Decodes the manufacturer-data payload. A version this build does not speak is reported
    /// distinctly so a scanner can say "box needs a newer Boxkey".
    public static func decode(_ bytes: [UInt8]) throws(DecodeError) -> Advertisement {
        guard bytes.count == payloadLength else { throw .wrongLength(bytes.count) }
        let version = bytes[0] >> 4
        guard BoxkeyProtocol.supportedVersions.contains(version) else { throw .unsupportedVersion(version) }
        let raw = UInt16(bytes[1]) << 8 | UInt16(bytes[2])
        guard let id = BoxID(raw) else { throw .invalidBoxID(raw) }
        return Advertisement(version: version, flags: Flags(rawValue: bytes[0] & 0x0f), boxID: id,
                             nonce: UInt16(bytes[3]) << 8 | UInt16(bytes[4]), keyHint: bytes[5])
    }

    /// The Noise prologue: what both sides must have seen for the handshake to succeed.
    /// "BOXKEY" || version || box ID (2, BE) || nonce (2, BE). Flags are left out because they
    /// change while a phone connects.
    public var prologue: [UInt8] {
        Array("BOXKEY".utf8) + [version, UInt8(boxID.value >> 8), UInt8(boxID.value & 0xff),
                                UInt8(nonce >> 8), UInt8(nonce & 0xff)]
    }

    /// The full legacy advertising data, as a controller would put on air (BlueZ builds the
    /// same bytes from `LEAdvertisement1` properties). Used to prove the 31-byte budget holds.
    public func advertisingData() -> [UInt8] {
        var ad: [UInt8] = [0x02, 0x01, 0x06]
        let uuid = uuidBytesLittleEndian(BoxkeyProtocol.serviceUUID)
        ad += [UInt8(1 + uuid.count), 0x07] + uuid
        let payload = encode()
        ad += [UInt8(1 + 2 + payload.count), 0xff,
               UInt8(BoxkeyProtocol.companyID & 0xff), UInt8(BoxkeyProtocol.companyID >> 8)] + payload
        return ad
    }
}

/// A UUID string's 16 bytes in the little-endian order that AD structures use.
func uuidBytesLittleEndian(_ uuid: String) -> [UInt8] {
    let bytes = unhex(uuid.replacingOccurrences(of: "-", with: ""))!
    return bytes.reversed()
}

extension String {
    fileprivate func replacingOccurrences(of target: String, with replacement: String) -> String {
        split(separator: Character(target), omittingEmptySubsequences: false).joined(separator: replacement)
    }
}
