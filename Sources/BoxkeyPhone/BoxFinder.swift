import BoxkeyCore
import BoxkeyRadio
import NIOConcurrencyHelpers

/// A box as the phone heard it: where, its advertisement then, and how strong (nil when the
/// advertisement comes from `boxes.json` rather than the air).
public struct HeardBox: Sendable, Equatable {
    public var address: DeviceAddress
    public var advertisement: Advertisement
    public var rssi: Int?

    public init(address: DeviceAddress, advertisement: Advertisement, rssi: Int?) {
        self.address = address
        self.advertisement = advertisement
        self.rssi = rssi
    }
}

extension ScanResult {
    /// The Boxkey advertisement in this result, if it carries a valid one.
    public var boxAdvertisement: Advertisement? {
        advertisement.manufacturerData[BoxkeyProtocol.companyID].flatMap { try? Advertisement.decode($0) }
    }
}

/// Finds a box by ID on the air. With a pinned key, only advertisers whose key hint matches
/// count (two boxes may share an ID). When several match, the strongest heard within
/// `strongestWindow` of the first wins: boxes advertise every 100 ms or so, so the window
/// hears each box in range at least once without making every login wait long.
public struct BoxFinder: Sendable {
    public static let strongestWindow: Duration = .milliseconds(150)

    public let radio: any CentralRadio
    public init(radio: any CentralRadio) { self.radio = radio }

    /// Scans up to `timeout`; `progress` is told the time searched so far, about once a second.
    public func find(_ id: BoxID, pinned: PublicKey?, timeout: Duration,
                     progress: (@Sendable (Duration) -> Void)? = nil) async throws -> HeardBox? {
        let clock = MonotonicClock()
        let start = clock.now
        let state = NIOLockedValueBox<(best: HeardBox?, decideBy: Duration?)>((nil, nil))
        let results = radio.scan(ScanFilter(serviceUUIDs: [BoxkeyProtocol.serviceUUID], duplicates: true))
        return try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                for try await result in results {
                    guard let advert = result.boxAdvertisement, advert.boxID == id else { continue }
                    if let pinned, advert.keyHint != pinned.advertisementHint { continue }
                    let heard = HeardBox(address: result.address, advertisement: advert, rssi: result.rssi)
                    state.withLockedValue { s in
                        guard let b = s.best else {
                            s.best = heard
                            s.decideBy = clock.now + Self.strongestWindow
                            return
                        }
                        // The same box again: its freshest advertisement (nonce), its best RSSI.
                        if b.address == heard.address {
                            s.best = HeardBox(address: b.address, advertisement: advert, rssi: max(b.rssi ?? .min, result.rssi))
                        } else if result.rssi > (b.rssi ?? .min) {
                            s.best = heard
                        }
                    }
                }
                return false
            }
            group.addTask {
                var said = Duration.zero
                while clock.now - start < timeout {
                    try await Task.sleep(for: .milliseconds(25))
                    if let decideBy = state.withLockedValue({ $0.decideBy }), clock.now >= decideBy { return true }
                    let elapsed = clock.now - start
                    if let progress, elapsed - said >= .seconds(1) { said = elapsed; progress(elapsed) }
                }
                return true
            }
            _ = try await group.next()
            group.cancelAll()
            return state.withLockedValue { $0.best }
        }
    }
}

/// Finds a box by ID (see `BoxFinder`).
public func findBox(_ id: BoxID, pinned: PublicKey?, radio: any CentralRadio, timeout: Duration) async throws -> HeardBox? {
    try await BoxFinder(radio: radio).find(id, pinned: pinned, timeout: timeout)
}
