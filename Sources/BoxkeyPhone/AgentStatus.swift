import BoxkeyCore
import FoundationEssentials

/// What `boxkey agent status` shows.
public struct AgentStatus: Codable, Sendable, Equatable {
    public struct Presence: Codable, Sendable, Equatable {
        public var box: String
        public var connected: Bool
    }
    public var pid: Int32
    public var credentialsHeld: Bool
    public var user: String?
    public var expiresInSeconds: Int?
    public var presence: Presence?
    /// What the held credentials are: "password", "key" (no password: key mode) or "escrow"
    /// (an escrow secret); nil when none are held.
    public var mode: String?
    /// Proximity login on (`--proximity`), and whether its window after the PIN is still open.
    public var proximity: Bool?
    public var proximityOpen: Bool?

    enum CodingKeys: String, CodingKey { case pid, credentialsHeld, user, expiresInSeconds, presence, mode, proximity, proximityOpen }

    /// Every key, null when it has no value (the JSON's schema: docs/phone-json.md).
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(pid, forKey: .pid)
        try c.encode(credentialsHeld, forKey: .credentialsHeld)
        try c.encode(user, forKey: .user)
        try c.encode(expiresInSeconds, forKey: .expiresInSeconds)
        try c.encode(presence, forKey: .presence)
        try c.encode(mode, forKey: .mode)
        try c.encode(proximity ?? false, forKey: .proximity)
        try c.encode(proximityOpen ?? false, forKey: .proximityOpen)
    }
}
