import BoxkeyRadio

extension SimulatedLink: SimulatedLinkStatistics {
    public var statistics: (events: Int, bytes: Int, packets: Int) {
        let t = trace
        return ((t.map(\.lastEvent).max() ?? -1) + 1, t.reduce(0) { $0 + $1.valueBytes }, t.reduce(0) { $0 + $1.packets })
    }
}
