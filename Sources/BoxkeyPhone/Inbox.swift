import NIOConcurrencyHelpers

/// A queue with one consumer that can wait with a timeout.
final class Inbox<T: Sendable>: Sendable {
    private struct State {
        var items: [T] = []
        var closed = false
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = NIOLockedValueBox(State())

    func put(_ item: T) {
        state.withLockedValue { s -> CheckedContinuation<Void, Never>? in
            s.items.append(item)
            defer { s.waiter = nil }
            return s.waiter
        }?.resume()
    }

    func close() {
        state.withLockedValue { s -> CheckedContinuation<Void, Never>? in
            s.closed = true
            defer { s.waiter = nil }
            return s.waiter
        }?.resume()
    }

    private enum Step { case item(T), finished, wait }

    /// The next item, or nil on timeout or once closed and empty.
    func take(within timeout: Duration) async -> T? {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while true {
            let step = state.withLockedValue { s -> Step in
                if !s.items.isEmpty { return .item(s.items.removeFirst()) }
                return s.closed ? .finished : .wait
            }
            switch step {
            case .item(let t): return t
            case .finished: return nil
            case .wait:
                guard clock.now < deadline else { return nil }
                await withTaskGroup(of: Void.self) { group in
                    group.addTask { [self] in
                        await withTaskCancellationHandler {
                            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                                let now = state.withLockedValue { s -> Bool in
                                    if !s.items.isEmpty || s.closed || Task.isCancelled { return true }
                                    s.waiter = c
                                    return false
                                }
                                if now { c.resume() }
                            }
                        } onCancel: { [self] in
                            state.withLockedValue { s -> CheckedContinuation<Void, Never>? in defer { s.waiter = nil }; return s.waiter }?.resume()
                        }
                    }
                    group.addTask { try? await Task.sleep(until: deadline, clock: clock) }
                    await group.next()
                    group.cancelAll()
                }
            }
        }
    }
}
