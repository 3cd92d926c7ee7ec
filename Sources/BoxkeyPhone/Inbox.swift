import BoxkeyRadio
import NIOConcurrencyHelpers

/// A queue with one consumer that can wait with a timeout.
final class Inbox<T: Sendable>: Sendable {
    private struct State {
        var items: [T] = []
        var closed = false
    }
    private let state = NIOLockedValueBox(State())
    private let changes = ChangeSignal()

    func put(_ item: T) {
        state.withLockedValue { $0.items.append(item) }
        changes.signal()
    }

    func close() {
        state.withLockedValue { $0.closed = true }
        changes.signal()
    }

    private enum Step { case item(T), finished, wait }

    /// The next item, or nil on timeout, on cancellation, or once closed and empty.
    func take(within timeout: Duration) async -> T? {
        let clock = MonotonicClock()
        let deadline = clock.now + timeout
        while !Task.isCancelled {
            let version = changes.version
            let step = state.withLockedValue { s -> Step in
                if !s.items.isEmpty { return .item(s.items.removeFirst()) }
                return s.closed ? .finished : .wait
            }
            switch step {
            case .item(let t): return t
            case .finished: return nil
            case .wait:
                guard clock.now < deadline else { return nil }
                await changes.wait(since: version, until: deadline, clock: clock)
            }
        }
        return nil
    }
}
