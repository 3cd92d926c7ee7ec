import FoundationEssentials

/// What a box following the directory (RFC 4533) knows of it: the entries with phones, by
/// entryUUID as the change stream names them, and the other entries whose names the server
/// matched to theirs (look-alikes, by DN). The roster is made from both, as a whole read makes
/// it. Pure: `FleetService` feeds it the stream's messages.
public struct FleetMirror: Sendable {
    public struct Entry: Sendable, Equatable {
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
        /// The entry as it is now (added, changed, or sent by the refresh).
        case entry(uuid: [UInt8], Entry)
        /// Gone, or no longer a user with phones.
        case deleted(uuid: [UInt8])
        /// The refresh is complete: from here on the stream sends changes.
        case refreshed
    }

    private(set) var followed: [[UInt8]: Entry] = [:]
    private(set) var lookalikes: [String: Entry] = [:]
    /// The roster's view of each, parsed when it came.
    private var prepared: [[UInt8]: FleetRoster.Prepared] = [:]
    private var preparedLookalikes: [String: FleetRoster.Prepared] = [:]
    /// True once the refresh is complete.
    public private(set) var refreshed = false

    public init() {}

    /// Applies messages; returns the login names of entries that came or changed their names,
    /// whose look-alikes the caller looks up (`addLookalikes`) before it makes the roster.
    public mutating func apply(_ changes: [Change]) -> Set<String> {
        var names = Set<String>()
        for change in changes {
            switch change {
            case .entry(let uuid, let entry):
                if followed[uuid]?.names != entry.names { names.formUnion(entry.names) }
                followed[uuid] = entry
                prepared[uuid] = FleetRoster.Prepared(names: entry.names, number: entry.number, values: entry.values)
                lookalikes[entry.dn] = nil
                preparedLookalikes[entry.dn] = nil
            case .deleted(let uuid):
                followed[uuid] = nil
                prepared[uuid] = nil
            case .refreshed:
                refreshed = true
            }
        }
        return names
    }

    /// Entries the server matched to some followed entry's names, besides the followed ones.
    /// `replacing`: a whole look-up, which replaces the look-alikes known (one that went away
    /// stops counting); otherwise they are added to them (fail closed until the next whole one).
    public mutating func addLookalikes(_ entries: [Entry], replacing: Bool = false) {
        if replacing {
            lookalikes = [:]
            preparedLookalikes = [:]
        }
        let followedDNs = dns
        for e in entries where !followedDNs.contains(e.dn) {
            lookalikes[e.dn] = Entry(dn: e.dn, names: e.names, number: e.number, values: [])
            preparedLookalikes[e.dn] = FleetRoster.Prepared(names: e.names, number: e.number, values: [])
        }
    }

    public var names: Set<String> { Set(followed.values.flatMap(\.names)) }
    public var dns: Set<String> { Set(followed.values.map(\.dn)) }

    /// The roster as of `readAt`, and how many values and entries it left out.
    public func roster(readAt: Date) -> (roster: FleetRoster, skipped: Int) {
        var roster = FleetRoster(readAt: readAt)
        let followedDNs = dns
        let entries = Array(prepared.values) + preparedLookalikes.filter { !followedDNs.contains($0.key) }.map(\.value)
        let skipped = roster.add(prepared: entries)
        return (roster, skipped)
    }
}
