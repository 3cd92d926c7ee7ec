import BoxkeyRadio
import NIOConcurrencyHelpers

/// Wakes one sleeper early: the timer loop sleeps until its next deadline or until the box
/// rings because a nearer deadline appeared. A ring while nobody sleeps is remembered.
final class Doorbell: Sendable {
    private struct State {
        var rung = false
        var sleeper: CheckedContinuation<Void, Never>?
    }
    private let state = NIOLockedValueBox(State())

    func ring() {
        let sleeper = state.withLockedValue { s -> CheckedContinuation<Void, Never>? in
            if let c = s.sleeper { s.sleeper = nil; return c }
            s.rung = true
            return nil
        }
        sleeper?.resume()
    }

    /// Returns at `deadline` (nil: never) or at the next ring, whichever is first.
    func wait(until deadline: Duration?, clock: any RadioClock) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [self] in
                await withTaskCancellationHandler {
                    await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                        let now = state.withLockedValue { s -> Bool in
                            if s.rung || Task.isCancelled { s.rung = false; return true }
                            s.sleeper = c
                            return false
                        }
                        if now { c.resume() }
                    }
                } onCancel: { [self] in
                    state.withLockedValue { s -> CheckedContinuation<Void, Never>? in defer { s.sleeper = nil }; return s.sleeper }?.resume()
                }
            }
            if let deadline { group.addTask { try? await clock.sleep(until: deadline) } }
            await group.next()
            group.cancelAll()
        }
    }
}
