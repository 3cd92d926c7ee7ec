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
    public var now: Duration { kernelTime(CLOCK_MONOTONIC) }
    public func sleep(until deadline: Duration) async throws { try await kernelSleep(until: deadline, now: now) }
}

/// CLOCK_BOOTTIME: CLOCK_MONOTONIC that also counts time suspended (as Swift's ContinuousClock
/// does on Linux). For what must age while the machine sleeps: the phone agent's held
/// credentials and its proximity readings.
public struct BootClock: RadioClock {
    public init() {}
    public var now: Duration { kernelTime(CLOCK_BOOTTIME) }
    public func sleep(until deadline: Duration) async throws { try await kernelSleep(until: deadline, now: now) }
}

private func kernelTime(_ clock: clockid_t) -> Duration {
    var ts = timespec()
    clock_gettime(clock, &ts)
    return .seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
}

private func kernelSleep(until deadline: Duration, now: Duration) async throws {
    if deadline > now { try await Task.sleep(for: deadline - now) }
    try Task.checkCancellation()
}
