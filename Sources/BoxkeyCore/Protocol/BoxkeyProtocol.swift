/// Constants that the box and every phone must agree on. docs/protocol.md is the prose version
/// of this file; change both together.
public enum BoxkeyProtocol {
    /// Wire protocol version carried in the advertisement, every envelope and the Noise prologue.
    /// Version 2 (2026-11-23): enrolment proved at the box (pairing handshake with a code),
    /// unknown phones refused after message 1, authenticated keepalives. Version 1 phones are
    /// refused with `unsupportedVersion`: they must pair again.
    /// Version 3 (2026-11-25): every GATT fragment names its connection's channel (BlueZ sends
    /// notifications to every subscribed central), and fragments fit BlueZ's Multiple Handle
    /// Value Notifications (MTU - 5) and the 512-byte attribute limit. Keys and enrolments made
    /// under version 2 stay valid.
    /// Version 4 (2026-11-26): a push waits at the box's password prompt for Enter there, and
    /// the box says so (`awaitingEnter`), which a version 3 phone would take for a broken
    /// channel. Keys and enrolments stay valid.
    /// Version 5 (2026-11-28): a lock the box could not carry out says so (`notLockable`), and
    /// a lock or logout that failed on the presence link leaves that link up and guarding,
    /// where a version 4 phone expects it closed. Keys and enrolments stay valid.
    public static let version: UInt8 = 5
    /// Versions this build accepts. A peer with another version gets `Refusal.unsupportedVersion`.
    public static let supportedVersions: ClosedRange<UInt8> = 5...5

    /// While it is the presence link, the phone sends a sealed keepalive this often; the box
    /// counts a few missed ones as walking away (`[presence] keepalive_timeout_s`). An open
    /// link alone is no proof of presence: a relay can hold one up.
    public static let keepaliveInterval: Duration = .seconds(2)

    // GATT layout (docs/protocol.md, "GATT service").
    /// The Boxkey primary service, advertised in the complete list of 128-bit service UUIDs.
    public static let serviceUUID = "ea000001-caf9-4a51-a017-a07d06dfeed4"
    /// Read: the box's `BoxInfo` (version range, box ID, static public key) for pairing.
    public static let infoCharacteristicUUID = "ea000002-caf9-4a51-a017-a07d06dfeed4"
    /// Write and write-without-response: fragments from phone to box. BlueZ does not tell the
    /// server which of the two a central used, so both are accepted.
    public static let requestCharacteristicUUID = "ea000003-caf9-4a51-a017-a07d06dfeed4"
    /// Notify: fragments from box to phone.
    public static let responseCharacteristicUUID = "ea000004-caf9-4a51-a017-a07d06dfeed4"

    /// Manufacturer-specific data company identifier. 0xFFFF is the Bluetooth SIG value reserved
    /// for testing; a shipping product replaces it with its assigned company ID.
    public static let companyID: UInt16 = 0xFFFF

    // ATT limits (Core spec Vol 3 Part F 3.2.8, 3.2.9).
    public static let minimumATTMTU = 23
    public static let maximumATTMTU = 517
    /// ATT write/notify opcode (1) + handle (2) precede the value.
    public static let attHeaderLength = 3
    /// A Multiple Handle Value Notification: opcode (1) + handle (2) + length (2) per value.
    public static let multipleNotificationHeaderLength = 5
    /// No attribute value is longer (Core spec Vol 3 Part F 3.2.9), whatever the MTU.
    public static let maximumAttributeValueLength = 512
}

/// The four-digit box ID shown on the box's screen. A discovery hint, not a security boundary:
/// two boxes may share one, and the pinned key decides which box a phone talks to.
public struct BoxID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public static let range: ClosedRange<UInt16> = 0...9999
    public let value: UInt16

    public init?(_ value: UInt16) {
        guard Self.range.contains(value) else { return nil }
        self.value = value
    }

    /// Exactly four ASCII digits ("0042" is box 42).
    public init?(_ string: String) {
        let digits = Array(string.utf8)
        guard digits.count == 4, digits.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { return nil }
        self.init(UInt16(digits.reduce(0) { $0 * 10 + Int($1 - 48) }))
    }

    public var description: String {
        let s = String(value)
        return String(repeating: "0", count: 4 - s.count) + s
    }

    public static func < (a: BoxID, b: BoxID) -> Bool { a.value < b.value }
}

/// The release of this source tree, as `boxkey --version` and `boxkeyd --version` print it.
public enum BoxkeyRelease {
    public static let version = "0.7.0"
    public static var description: String { "\(version) (protocol \(BoxkeyProtocol.version))" }
}
