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
    private var drawn = 0
    let boxes: PairedBoxes

    public init(boxes: PairedBoxes) { self.boxes = boxes }

    /// Adds what a scan result says; returns the row, and whether the box is new.
    public mutating func add(_ result: ScanResult) -> (row: Row, isNew: Bool)? {
        guard let advert = result.boxAdvertisement else { return nil }
        let paired = boxes.key(of: advert.boxID).map { $0.advertisementHint == advert.keyHint } ?? false
        let row = Row(id: advert.boxID.description, address: result.address.string, rssi: result.rssi, paired: paired,
                      loginPrompt: advert.flags.contains(.loginPromptWaiting))
        let isNew = rows[row.address] == nil
        rows[row.address] = row
        return (row, isNew)
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

    public static func json(_ row: Row) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(row)) ?? Data(), as: UTF8.self)
    }
}
