import BoxkeyCore
import BoxkeyRadio
import FoundationEssentials

/// The boxes a scan has heard, strongest first, and their rendering: a plain line per box, a
/// JSON object per advertisement, or a table redrawn in place on a terminal.
public struct ScanTable: Sendable {
    public struct Row: Codable, Sendable, Equatable {
        public var id: String
        public var address: String
        public var rssi: Int
        public var paired: Bool
        public var loginPrompt: Bool

        public var line: String {
            "\(id)  \(String(repeating: " ", count: max(0, 4 - String(rssi).count)) + String(rssi)) dBm  \(paired ? "paired    " : "not paired")\(loginPrompt ? "  at login prompt" : "")  \(address)"
        }
    }

    public private(set) var rows: [String: Row] = [:]
    private var heardAt: [String: Duration] = [:]
    private var drawn = 0
    let boxes: PairedBoxes

    public init(boxes: PairedBoxes) { self.boxes = boxes }

    /// Adds what a scan result says; returns the row, and whether the box is new.
    public mutating func add(_ result: ScanResult, at now: Duration = .zero) -> (row: Row, isNew: Bool)? {
        guard let advert = result.boxAdvertisement else { return nil }
        let paired = boxes.key(of: advert.boxID).map { $0.advertisementHint == advert.keyHint } ?? false
        let row = Row(id: advert.boxID.description, address: result.address.string, rssi: result.rssi, paired: paired,
                      loginPrompt: advert.flags.contains(.loginPromptWaiting))
        let isNew = rows[row.address] == nil
        rows[row.address] = row
        heardAt[row.address] = now
        return (row, isNew)
    }

    /// What `scan --watch` reports of a box: heard for the first time, changed (a prompt began
    /// or ended waiting, it was paired, or its signal moved by `rssiStep` dB or more), or gone.
    public enum Change: String, Sendable { case new, changed, gone }
    public static let rssiStep = 5

    /// Adds a scan result, for `--watch`: the row and its change, or nil when nothing a person
    /// would notice changed (the same box, a few dB either way).
    public mutating func watch(_ result: ScanResult, at now: Duration) -> (row: Row, change: Change)? {
        let before = rows[result.address.string]
        guard let (row, isNew) = add(result, at: now) else { return nil }
        if isNew { return (row, .new) }
        guard let before else { return nil }
        if before.loginPrompt != row.loginPrompt || before.paired != row.paired || abs(before.rssi - row.rssi) >= Self.rssiStep {
            return (row, .changed)
        }
        // Not worth a line: the row keeps the signal it was last reported with.
        rows[row.address] = before
        return nil
    }

    /// Boxes not heard for `after`: out of range, or switched off. They leave the table.
    public mutating func expire(at now: Duration, after: Duration) -> [Row] {
        let gone = heardAt.filter { now - $0.value >= after }.keys
        return gone.compactMap { address in
            heardAt[address] = nil
            return rows.removeValue(forKey: address)
        }.sorted { $0.id < $1.id }
    }

    public var sorted: [Row] { rows.values.sorted { $0.rssi > $1.rssi } }

    /// The terminal redraw: up over what was drawn last, the rows, and a status line.
    public mutating func redraw(status: String) -> String {
        var out = drawn > 0 ? "\u{1B}[\(drawn)F" : ""
        let rows = sorted
        for r in rows { out += "\u{1B}[2K" + r.line + "\n" }
        out += "\u{1B}[2K" + status + "\n"
        drawn = rows.count + 1
        return out
    }

    /// A `--watch --json` line: the row and what changed.
    public static func json(_ row: Row, change: Change) -> String {
        struct Line: Encodable {
            let row: Row
            let change: Change
            enum Key: String, CodingKey { case change }
            func encode(to encoder: any Encoder) throws {
                try row.encode(to: encoder)
                var c = encoder.container(keyedBy: Key.self)
                try c.encode(change.rawValue, forKey: .change)
            }
        }
        return encoded(Line(row: row, change: change))
    }

    public static func json(_ row: Row) -> String { encoded(row) }

    private static func encoded(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(value)) ?? Data(), as: UTF8.self)
    }
}
