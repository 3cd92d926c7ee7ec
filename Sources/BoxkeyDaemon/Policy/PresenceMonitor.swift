import BoxkeyCore

/// One presence link: is the phone still here? Pure (time and samples are passed in).
///
/// Three signals, any of which means "walked away":
/// - no sealed keepalive for `keepaliveTimeout` (a relay or a stuck link that carries nothing
///   authenticated is not presence);
/// - the mean of the last `samples` RSSI readings below `lockThreshold` for `awayAfter`, the
///   countdown cleared only above `returnThreshold` (hysteresis);
/// - RSSI unreadable for `awayAfter` (a failed read is no sample, never a good one).
public struct PresenceMonitor: Sendable {
    public struct Settings: Sendable {
        public var keepaliveTimeout: Duration
        public var rssiInterval: Duration
        public var samples: Int
        public var lockThreshold: Int
        public var returnThreshold: Int
        public var awayAfter: Duration
    }

    public let phone: PublicKey
    public let user: String
    let settings: Settings
    private(set) var lastKeepalive: Duration
    private var readings: [Int] = []
    private var belowSince: Duration?
    private var failingSince: Duration?
    public private(set) var nextSample: Duration

    public init(phone: PublicKey, user: String, settings: Settings, now: Duration) {
        self.phone = phone
        self.user = user
        self.settings = settings
        lastKeepalive = now
        nextSample = now + settings.rssiInterval
    }

    /// The phone asked for a lock or logout on this link and waits for the answer, sending no
    /// keepalives meanwhile (the protocol has none while an action runs): the box's own wait
    /// on logind (`lock_confirm_s`, which may be longer than `keepaliveTimeout`) is no sign
    /// that the phone left. Link loss and the signal still count.
    public private(set) var acting = false

    public mutating func keepalive(now: Duration) { lastKeepalive = now }

    public mutating func actionStarted() { acting = true }

    /// The action's answer went out: the keepalive timeout starts again from `now`.
    public mutating func actionEnded(now: Duration) {
        acting = false
        lastKeepalive = now
    }

    /// Why the phone counts as gone at `now`, or nil.
    public func away(now: Duration) -> String? {
        if !acting, now - lastKeepalive >= settings.keepaliveTimeout {
            return "no keepalive for \(spokenDuration(now - lastKeepalive))"
        }
        if let since = belowSince, now - since >= settings.awayAfter {
            return "signal below \(settings.lockThreshold) dBm"
        }
        if let since = failingSince, now - since >= settings.awayAfter {
            return "signal unreadable for \(spokenDuration(now - since))"
        }
        return nil
    }

    /// What a reading changed: the weak-signal countdown started, or the signal came back and
    /// ended it. The journal says both, so that a lock on a weak signal can be explained.
    public enum SignalChange: Equatable, Sendable {
        case weak(mean: Double)
        case back(mean: Double)
    }

    /// One RSSI reading, nil when the read failed. Always moves `nextSample` on, so a failing
    /// read never makes the timer loop spin.
    @discardableResult
    public mutating func sample(_ rssi: Int?, now: Duration) -> SignalChange? {
        nextSample = now + settings.rssiInterval
        guard let rssi else {
            failingSince = failingSince ?? now
            return nil
        }
        failingSince = nil
        readings.append(rssi)
        if readings.count > settings.samples { readings.removeFirst(readings.count - settings.samples) }
        if readings.count >= settings.samples, mean < Double(settings.lockThreshold) {
            guard belowSince == nil else { return nil }
            belowSince = now
            return .weak(mean: mean)
        } else if mean > Double(settings.returnThreshold), belowSince != nil {
            belowSince = nil
            return .back(mean: mean)
        }
        return nil
    }

    public var mean: Double { readings.isEmpty ? 0 : Double(readings.reduce(0, +)) / Double(readings.count) }

    /// When a missing keepalive makes the phone gone (the timer loop's deadline); none while
    /// an action runs.
    public var keepaliveDeadline: Duration? { acting ? nil : lastKeepalive + settings.keepaliveTimeout }
}
