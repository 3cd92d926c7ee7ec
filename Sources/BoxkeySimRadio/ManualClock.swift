import BoxkeyRadio
import Dispatch
import NIOConcurrencyHelpers

/// A clock that moves only when a test says so. Not a model of anything: it lets tests check
/// timeouts (supervision, handshake, grace periods) without sleeping.
public final class ManualClock: RadioClock {
    private struct Sleeper {
        let deadline: Duration
        let continuation: CheckedContinuation<Void, any Error>
    }
    private struct State {
        var now: Duration
        var sleepers: [UInt64: Sleeper] = [:]
        var nextID: UInt64 = 0
        /// Tests waiting for someone to sleep until a deadline (`someoneSleeps(until:)`).
        var watchers: [(id: UInt64, deadline: Duration, continuation: CheckedContinuation<Bool, Never>)] = []
    }
    private let state: NIOLockedValueBox<State>

    public init(now: Duration = .zero) {
        state = NIOLockedValueBox(State(now: now))
    }

    public var now: Duration { state.withLockedValue { $0.now } }

    /// How many tasks are waiting on this clock.
    public var sleeperCount: Int { state.withLockedValue { $0.sleepers.count } }

    public func sleep(until deadline: Duration) async throws {
        let id = state.withLockedValue { s -> UInt64 in s.nextID += 1; return s.nextID }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                enum Now { case due, cancelled, asleep([CheckedContinuation<Bool, Never>]) }
                let now = state.withLockedValue { s -> Now in
                    if deadline <= s.now { return .due }
                    // Cancelled before this point, the handler below found nothing to end: a
                    // sleeper registered now would wait for an `advance` that may never come
                    // (a test's services cancelled at its end hung the whole run so).
                    if Task.isCancelled { return .cancelled }
                    s.sleepers[id] = Sleeper(deadline: deadline, continuation: c)
                    let watching = s.watchers.filter { $0.deadline == deadline }.map(\.continuation)
                    s.watchers.removeAll { $0.deadline == deadline }
                    return .asleep(watching)
                }
                switch now {
                case .due: c.resume()
                case .cancelled: c.resume(throwing: CancellationError())
                case .asleep(let watching): for w in watching { w.resume(returning: true) }
                }
            }
        } onCancel: {
            let sleeper = state.withLockedValue { $0.sleepers.removeValue(forKey: id) }
            sleeper?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Returns true once a task sleeps on this clock until exactly `deadline` (at once if one
    /// does already): how a test knows a loop has gone to sleep until what it was due, without
    /// waiting on real time. False if none has after `timeout` of real time (a failing test
    /// then says so instead of hanging).
    public func someoneSleeps(until deadline: Duration, timeout: Duration = .seconds(10)) async -> Bool {
        let id = state.withLockedValue { s -> UInt64 in s.nextID += 1; return s.nextID }
        return await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
            let already = state.withLockedValue { s -> Bool in
                if s.sleepers.values.contains(where: { $0.deadline == deadline }) { return true }
                s.watchers.append((id, deadline, c))
                return false
            }
            if already { c.resume(returning: true); return }
            // Set once the watcher is there, so that the timer always finds it.
            let (seconds, attoseconds) = timeout.components
            DispatchQueue.global().asyncAfter(deadline: .now() + Double(seconds) + Double(attoseconds) / 1e18) { [state] in
                let late = state.withLockedValue { s -> CheckedContinuation<Bool, Never>? in
                    guard let i = s.watchers.firstIndex(where: { $0.id == id }) else { return nil }
                    return s.watchers.remove(at: i).continuation
                }
                late?.resume(returning: false)
            }
        }
    }

    /// Moves time forward and wakes every sleeper whose deadline has passed, earliest first.
    public func advance(by duration: Duration) {
        advance(to: now + duration)
    }

    public func advance(to instant: Duration) {
        let due = state.withLockedValue { s -> [Sleeper] in
            s.now = max(s.now, instant)
            let ids = s.sleepers.filter { $0.value.deadline <= s.now }.sorted { $0.value.deadline < $1.value.deadline }.map(\.key)
            return ids.compactMap { s.sleepers.removeValue(forKey: $0) }
        }
        for sleeper in due { sleeper.continuation.resume() }
    }
}
