import FoundationEssentials

/// What a box following the directory (RFC 4533) knows of it: the entries of the stream (users
/// with phones, and the containers above them) by entryUUID, and the other entries whose names
/// the server matched to theirs (look-alikes, by DN). The roster is made from both, as a whole
/// read makes it. Pure: `FleetService` feeds it the stream's messages and the look-ups' answers.
public struct FleetMirror: Sendable {
    public struct Entry: Sendable, Hashable {
        public var dn: String
        public var names: [String]
        public var number: String?
        public var values: [String]
        public init(dn: String, names: [String], number: String?, values: [String]) {
            self.dn = dn
            self.names = names
            self.number = number
            self.values = values
        }
    }

    /// One message of the stream.
    public enum Change: Sendable, Equatable {
        /// The entry as it is now (added, changed, moved, or sent by the refresh).
        case entry(uuid: [UInt8], Entry)
        /// Gone, out of the base, or no longer a user with phones.
        case deleted(uuid: [UInt8])
        /// The refresh is complete: from here on the stream sends changes.
        case refreshed
    }

    /// An entry as the roster takes it (its values parsed and capped when it came: an entry
    /// with thousands of values costs no more to hold than one with sixteen).
    struct Held: Sendable, Equatable {
        var dn: String {
            didSet { key = FleetMirror.key(dn) }
        }
        /// The DN in lower case, made once.
        private(set) var key: String
        var entry: FleetRoster.Prepared
        /// Of the entry as the server sent it: the same entry again (a write to an attribute
        /// the box does not read) is passed over without parsing its values.
        var digest = 0

        init(dn: String, entry: FleetRoster.Prepared, digest: Int = 0) {
            self.dn = dn
            key = FleetMirror.key(dn)
            self.entry = entry
            self.digest = digest
        }
        /// A container (no login name, no phone): followed only for the entries below it.
        var isContainer: Bool { entry.names.isEmpty && entry.phones.isEmpty && entry.skipped == 0 }
    }

    private(set) var followed: [[UInt8]: Held] = [:]
    /// By DN in lower case.
    private(set) var lookalikes: [String: Held] = [:]
    /// True once the refresh is complete.
    public private(set) var refreshed = false

    public init() {}

    public var count: Int { followed.count }

    /// Applies messages. `changed`: whether the roster may differ (a rewrite of what the roster
    /// does not use, a user's description, changes nothing). `lookUp`: names that came (a new
    /// entry, a rename) and must be looked up among all entries (`lookedUp`) before the roster
    /// vouches for them. A name that left (an entry out of the stream) is not looked up: that
    /// could only let a copy of it vouch again, which waits for the next whole refresh.
    public mutating func apply(_ changes: [Change]) -> (changed: Bool, lookUp: Set<String>) {
        var changed = false
        var lookUp = Set<String>()
        for change in changes {
            switch change {
            case .entry(let uuid, let e):
                let old = followed[uuid]
                let digest = e.hashValue
                guard old?.digest != digest else { continue }
                let new = Held(dn: e.dn, entry: FleetRoster.Prepared(names: e.names, number: e.number, values: e.values), digest: digest)
                guard old?.dn != new.dn || old?.entry != new.entry else {
                    followed[uuid]?.digest = digest
                    continue
                }
                changed = true
                if let old, old.key != new.key { move(below: old.dn, to: new.dn) }
                if old?.entry.names != new.entry.names { lookUp.formUnion(new.entry.names) }
                followed[uuid] = new
                lookalikes[new.key] = nil
            case .deleted(let uuid):
                guard let old = followed.removeValue(forKey: uuid) else { continue }
                changed = true
                // A subtree moved out of the base, or deleted: the server tells of its top only.
                let suffix = "," + old.key
                for (id, held) in followed where held.key.hasSuffix(suffix) { followed[id] = nil }
                // Its last phone taken, the entry is still there, out of the stream: its name
                // keeps counting against copies of it until a look-up of that name (the entry
                // back with a phone) or the next whole refresh says otherwise.
                if !old.entry.names.isEmpty {
                    lookalikes[old.key] = Held(dn: old.dn, entry: FleetRoster.Prepared(names: old.entry.names, number: old.entry.number.map { String($0) }, values: []))
                }
            case .refreshed:
                refreshed = true
            }
        }
        return (changed, lookUp)
    }

    /// The followed entries below `old` now are below `new` (a container renamed or moved).
    private mutating func move(below old: String, to new: String) {
        let suffix = "," + Self.key(old)
        for (id, held) in followed where held.key.hasSuffix(suffix) {
            followed[id]?.dn = String(held.dn.dropLast(old.count)) + new
        }
    }

    /// What the server answered for `names` (every entry it matches to one of them, by its own
    /// rules), in place of what was known of those names; `nil` names: a look-up of every name.
    public mutating func lookedUp(_ names: Set<String>?, found: [Entry]) {
        if let names {
            let keys = Set(names.map(FleetRoster.lookalike))
            lookalikes = lookalikes.filter { $0.value.entry.lookalikes.isDisjoint(with: keys) }
        } else {
            lookalikes = [:]
        }
        let followedDNs = dns
        for e in found where !followedDNs.contains(Self.key(e.dn)) {
            lookalikes[Self.key(e.dn)] = Held(dn: e.dn, entry: FleetRoster.Prepared(names: e.names, number: e.number, values: []))
        }
    }

    public var names: Set<String> { Set(followed.values.flatMap(\.entry.names)) }
    /// The followed entries' DNs, in lower case.
    public var dns: Set<String> { Set(followed.values.map(\.key)) }
    /// Every DN the look-ups should not count again (the followed ones), as the server gives them.
    public var followedDNs: Set<String> { Set(followed.values.map(\.dn)) }

    /// The roster as of `readAt`, and how many values and entries it left out.
    public func roster(readAt: Date) -> (roster: FleetRoster, skipped: Int) {
        var roster = FleetRoster(readAt: readAt)
        let followedDNs = dns
        let entries = followed.values.filter { !$0.isContainer }.map(\.entry)
            + lookalikes.filter { !followedDNs.contains($0.key) }.map(\.value.entry)
        let skipped = roster.add(prepared: entries)
        return (roster, skipped)
    }

    /// DNs compare without regard to case (roughly as servers compare them).
    static func key(_ dn: String) -> String { dn.lowercased() }
}
