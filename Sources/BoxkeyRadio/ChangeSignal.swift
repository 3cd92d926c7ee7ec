import NIOConcurrencyHelpers

/// "Something changed" for waiters that also have a deadline: a version number that every
/// `signal()` bumps, and `wait(since:until:)` that returns once the version moved past the one
/// the caller last saw, or at the deadline, or on cancellation. Checking the version under the
/// same lock as registering the waiter means a change can never slip between a caller's look
/// at its state and its wait.
public final class ChangeSignal: Sendable {
    private struct State {
        var version: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextID: UInt64 = 0
    }
    private let state = NIOLockedValueBox(State())

    public init() {}

    public var version: UInt64 { state.withLockedValue { $0.version } }

    /// Bumps the version and wakes every waiter.
    public func signal() {
        let waiters = state.withLockedValue { s -> [CheckedContinuation<Void, Never>] in
            s.version &+= 1
            defer { s.waiters = [:] }
            return Array(s.waiters.values)
        }
        waiters.forEach { $0.resume() }
    }

    /// Returns when the version differs from `version`, at `deadline` on `clock` (nil: no
    /// deadline), or when the task is cancelled.
    public func wait(since version: UInt64, until deadline: Duration?, clock: any RadioClock) async {
        let id = state.withLockedValue { s -> UInt64 in s.nextID &+= 1; return s.nextID }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [self] in
                await withTaskCancellationHandler {
                    await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                        let now = state.withLockedValue { s -> Bool in
                            if s.version != version || Task.isCancelled { return true }
                            s.waiters[id] = c
                            return false
                        }
                        if now { c.resume() }
                    }
                } onCancel: { [self] in
                    state.withLockedValue { $0.waiters.removeValue(forKey: id) }?.resume()
                }
            }
            if let deadline { group.addTask { try? await clock.sleep(until: deadline) } }
            await group.next()
            group.cancelAll()
        }
    }
}
