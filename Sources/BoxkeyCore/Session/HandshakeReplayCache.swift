/// Remembers the initiator ephemeral keys of accepted handshakes while their advertisement nonce
/// is still accepted, so a recorded message 1 replayed within that window is refused outright
/// (outside it, the stale nonce already refuses it). A replayed message 1 could never lead to a
/// credential push anyway (the attacker lacks the phone's keys for message 3); refusing it saves
/// the box a DH computation and a connection slot, and makes replays visible in the logs.
public struct HandshakeReplayCache: Sendable {
    /// How many handshakes are kept. At the bound, the oldest handshake of the phone key that
    /// holds the most is forgotten, and of keys holding equally many, the one heard from last: a
    /// key that floods the box ages out only its own, and so does a flood of keys, and every
    /// other phone's recorded message 1 stays a replay. (Flooding needs enrolled or pending keys,
    /// or a live pairing code's three tries: the box's policy refuses other keys before the
    /// cache.) Refusing every handshake at the bound, until the nonce rotated, let one enrolled
    /// insider at about 34 connections a second lock out every phone. A forgotten handshake
    /// replayed costs the box a DH and, for the command timeout, a slot the flooding key could
    /// have taken itself (one of its own two, its user's, or the new phones').
    public let capacity: Int
    private struct Entry: Hashable {
        var nonce: UInt16
        var ephemeral: [UInt8]
    }
    private var seen: Set<Entry> = []
    private var byPhone: [[UInt8]: (entries: [Entry], last: UInt64)] = [:]  // entries oldest first; last: when heard
    private var heard: UInt64 = 0

    public init(capacity: Int = 4096) { self.capacity = capacity }

    public enum Verdict: Equatable, Sendable { case fresh, replayed }

    /// Records `ephemeral` under `nonce` for the phone key `phone`; says whether it was already there.
    public mutating func insert(_ ephemeral: PublicKey, nonce: UInt16, phone: PublicKey) -> Verdict {
        let entry = Entry(nonce: nonce, ephemeral: ephemeral.bytes)
        if seen.contains(entry) { return .replayed }
        if seen.count >= capacity {
            forgetOne()
        }
        heard += 1
        seen.insert(entry)
        byPhone[phone.bytes, default: ([], 0)].entries.append(entry)
        byPhone[phone.bytes]?.last = heard
        return .fresh
    }

    /// Forgets the oldest handshake of the key holding the most (of those, the one heard from last).
    private mutating func forgetOne() {
        guard let heaviest = byPhone.max(by: { ($0.value.entries.count, $0.value.last) < ($1.value.entries.count, $1.value.last) })?.key,
              let oldest = byPhone[heaviest]?.entries.first else { return }
        seen.remove(oldest)
        byPhone[heaviest]?.entries.removeFirst()
        if byPhone[heaviest]?.entries.isEmpty == true { byPhone[heaviest] = nil }
    }

    /// Drops every nonce not in `live` (called when the advertisement nonce rotates).
    public mutating func retain(nonces live: Set<UInt16>) {
        seen = seen.filter { live.contains($0.nonce) }
        byPhone = byPhone.compactMapValues { phone in
            let kept = phone.entries.filter { live.contains($0.nonce) }
            return kept.isEmpty ? nil : (kept, phone.last)
        }
    }

    public var count: Int { seen.count }
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
