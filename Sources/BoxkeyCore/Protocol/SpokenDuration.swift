/// A duration as people and the journal read it: "6.0 s", "450 ms", "2 min 5 s", "3 h 10 min",
/// never Swift's "6.000501567000001 seconds".
public func spokenDuration(_ d: Duration) -> String {
    let (seconds, attoseconds) = d.components
    let negative = seconds < 0 || (seconds == 0 && attoseconds < 0)
    let ms = abs(seconds * 1000 + attoseconds / 1_000_000_000_000_000)
    let text: String
    switch ms {
    case ..<1000: text = "\(ms) ms"
    case ..<60_000: text = "\(ms / 1000).\(ms % 1000 / 100) s"
    case ..<3_600_000: text = ms % 60_000 / 1000 == 0 ? "\(ms / 60_000) min" : "\(ms / 60_000) min \(ms % 60_000 / 1000) s"
    default: text = ms % 3_600_000 / 60_000 == 0 ? "\(ms / 3_600_000) h" : "\(ms / 3_600_000) h \(ms % 3_600_000 / 60_000) min"
    }
    return negative ? "-" + text : text
}
