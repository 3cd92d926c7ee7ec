/// Counts events in a sliding window: "at most `limit` in any `window`". Pure; time is passed in.
public struct RateLimiter<Key: Hashable & Sendable>: Sendable {
    public var limit: Int
    public var window: Duration
    private var events: [Key: [Duration]] = [:]

    public init(limit: Int, window: Duration) {
        self.limit = limit
        self.window = window
    }

    /// True if another event for `key` at `now` would exceed the limit.
    public mutating func isLimited(_ key: Key, now: Duration) -> Bool {
        prune(key, now: now)
        return (events[key]?.count ?? 0) >= limit
    }

    /// Events for `key` within the window.
    public mutating func count(_ key: Key, now: Duration) -> Int {
        prune(key, now: now)
        return events[key]?.count ?? 0
    }

    public mutating func record(_ key: Key, now: Duration) {
        prune(key, now: now)
        events[key, default: []].append(now)
    }

    /// Forgets every key whose events are all out of the window (addresses that never came
    /// back would otherwise stay for good).
    public mutating func pruneAll(now: Duration) {
        for key in Array(events.keys) { prune(key, now: now) }
    }

    private mutating func prune(_ key: Key, now: Duration) {
        guard var list = events[key] else { return }
        list.removeAll { now - $0 >= window }
        events[key] = list.isEmpty ? nil : list
    }
}
