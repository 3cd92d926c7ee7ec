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

    /// Users followed (not containers): the refresh's limit is on these.
    public var count: Int { followed.values.count(where: { !$0.isContainer }) }
    public var containers: Int { followed.count - count }

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
                var gone = [old]
                // A subtree moved out of the base, or deleted: the server tells of its top only.
                if old.isContainer {
                    let suffix = "," + old.key
                    for (id, held) in followed where held.key.hasSuffix(suffix) {
                        followed[id] = nil
                        gone.append(held)
                    }
                }
                // An entry whose last phone was taken is still there, out of the stream (and
                // one moved out may be back): its name keeps counting against copies of it
                // until a look-up of that name or the next whole refresh says otherwise.
                for held in gone where !held.entry.names.isEmpty {
                    lookalikes[held.key] = Held(dn: held.dn, entry: FleetRoster.Prepared(names: held.entry.names, number: held.entry.number.map { String($0) }, values: []))
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
            followed[id]?.digest = 0  // it was of the old DN: the entry sent as it was must not pass as unchanged
        }
    }

    /// The names to search for `names`: each the fleet takes, and what each looks like when
    /// that is one (`Alice`, `ａｌｉｃｅ` → `alice`), so the server finds every entry they could
    /// be taken for. A name that is neither is not searched (and its look-alikes stay known).
    public static func searched(_ names: Set<String>) -> Set<String> {
        Set(names.flatMap { [$0, FleetRoster.lookalike($0)] }.filter(FleetRoster.isFleetName))
    }

    /// What the server answered for `searched` (as `searched(_:)` gives; every entry it matches
    /// to one of them, by its own rules), in place of what was known of exactly those names;
    /// `nil`: a look-up of every name.
    public mutating func lookedUp(_ searched: Set<String>?, found: [Entry]) {
        if let searched {
            lookalikes = lookalikes.filter { $0.value.entry.lookalikes.isDisjoint(with: searched) }
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

    /// The roster as of `readAt`, and how many values and entries it left out. Entries whose
    /// names look like one of `withholding` (names not yet looked up) vouch for nobody.
    public func roster(readAt: Date, withholding: Set<String> = []) -> (roster: FleetRoster, skipped: Int) {
        var roster = FleetRoster(readAt: readAt)
        let followedDNs = dns
        let entries = followed.values.filter { !$0.isContainer }.map(\.entry)
            + lookalikes.filter { !followedDNs.contains($0.key) }.map(\.value.entry)
        let skipped = roster.add(prepared: entries, withholding: Set(withholding.map(FleetRoster.lookalike)))
        return (roster, skipped)
    }

    /// DNs compare without regard to case (roughly as servers compare them).
    static func key(_ dn: String) -> String { dn.lowercased() }
}
