#if canImport(Glibc)
import Glibc
#endif

/// The time a radio runs on. `now` is a duration since an arbitrary origin; the real clock's
/// origin is the system's monotonic clock, so that separate processes agree on it.
public protocol RadioClock: Sendable {
    var now: Duration { get }
    func sleep(until deadline: Duration) async throws
}

extension RadioClock {
    public func sleep(for duration: Duration) async throws {
        try await sleep(until: now + duration)
    }
}

/// CLOCK_MONOTONIC: one time base for every process on the machine.
public struct MonotonicClock: RadioClock {
    public init() {}

    public var now: Duration {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return .seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
    }

    public func sleep(until deadline: Duration) async throws {
        let remaining = deadline - now
        if remaining > .zero { try await Task.sleep(for: remaining) }
        try Task.checkCancellation()
    }
}

/// CLOCK_BOOTTIME: CLOCK_MONOTONIC that also counts time suspended (as Swift's ContinuousClock
/// does on Linux). For what must age while the machine sleeps: the phone agent's held
/// credentials and its proximity readings.
public struct BootClock: RadioClock {
    public init() {}

    public var now: Duration {
        var ts = timespec()
        clock_gettime(CLOCK_BOOTTIME, &ts)
        return .seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
    }

    public func sleep(until deadline: Duration) async throws {
        let remaining = deadline - now
        if remaining > .zero { try await Task.sleep(for: remaining) }
        try Task.checkCancellation()
    }
}
