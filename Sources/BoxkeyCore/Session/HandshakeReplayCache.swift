/// Remembers the initiator ephemeral keys of accepted handshakes while their advertisement nonce
/// is still accepted, so a recorded message 1 replayed within that window is refused outright
/// (outside it, the stale nonce already refuses it). A replayed message 1 could never lead to a
/// credential push anyway (the attacker lacks the phone's keys for message 3); refusing it saves
/// the box a DH computation and a connection slot, and makes replays visible in the logs.
public struct HandshakeReplayCache: Sendable {
    /// Entries are kept per nonce; with the overall handshake rate limit this bound is never
    /// reached in normal use. When it is, new handshakes are refused (fail closed) until the
    /// nonce rotates.
    public let capacity: Int
    private var seen: [UInt16: Set<[UInt8]>] = [:]
    private var total = 0

    public init(capacity: Int = 4096) { self.capacity = capacity }

    public enum Verdict: Equatable, Sendable { case fresh, replayed, full }

    /// Records `ephemeral` under `nonce`; says whether it was already there.
    public mutating func insert(_ ephemeral: PublicKey, nonce: UInt16) -> Verdict {
        if seen[nonce]?.contains(ephemeral.bytes) == true { return .replayed }
        guard total < capacity else { return .full }
        seen[nonce, default: []].insert(ephemeral.bytes)
        total += 1
        return .fresh
    }

    /// Drops every nonce not in `live` (called when the advertisement nonce rotates).
    public mutating func retain(nonces live: Set<UInt16>) {
        for nonce in seen.keys where !live.contains(nonce) {
            total -= seen[nonce]?.count ?? 0
            seen[nonce] = nil
        }
    }

    public var count: Int { total }
}

/// The box's advertisement nonces: the current one and the one before it. A handshake must name
/// one of them, which bounds how stale an advertisement a relay can forward to twice the
/// rotation period.
public struct AdvertisementNonces: Sendable, Equatable {
    public private(set) var current: UInt16
    public private(set) var previous: UInt16?

    public init(current: UInt16) { self.current = current }

    public static func random() -> AdvertisementNonces {
        AdvertisementNonces(current: UInt16(truncatingIfNeeded: SystemRandom.uniform(1 << 16)))
    }

    public func accepts(_ nonce: UInt16) -> Bool {
        nonce == current || nonce == previous
    }

    /// Moves to a fresh random nonce different from the last two.
    public mutating func rotate() {
        var next: UInt16
        repeat { next = UInt16(truncatingIfNeeded: SystemRandom.uniform(1 << 16)) } while next == current || next == previous
        previous = current
        current = next
    }

    public var live: Set<UInt16> {
        var s: Set<UInt16> = [current]
        if let previous { s.insert(previous) }
        return s
    }
}
