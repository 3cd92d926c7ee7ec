import BoxkeyRadio
import NIOConcurrencyHelpers

/// A single-consumer queue of items due at modelled times. With `.realTime` pacing the
/// consumer receives each item when the clock reaches its time; with `.instant` pacing it
/// receives traffic at once (the item still carries its time), while timer items — a
/// supervision timeout — always wait for the clock.
final class TimedMailbox<Item: Sendable>: Sendable {
    struct Entry: Sendable {
        var time: Duration
        var item: Item
        var waitsForClock: Bool
        var tag: UInt64?
    }
    private struct State {
        var entries: [Entry] = []
        var closed = false
    }

    private let state = NIOLockedValueBox(State())
    private let changes = ChangeSignal()
    private let clock: any RadioClock
    private let pacing: Pacing

    init(clock: any RadioClock, pacing: Pacing) {
        self.clock = clock
        self.pacing = pacing
    }

    /// Adds an item, keeping time order (stable for equal times).
    func push(_ item: Item, at time: Duration, waitsForClock: Bool = false, tag: UInt64? = nil) {
        state.withLockedValue { s in
            guard !s.closed else { return }
            let index = s.entries.lastIndex { $0.time <= time }.map { $0 + 1 } ?? 0
            s.entries.insert(Entry(time: time, item: item, waitsForClock: waitsForClock, tag: tag), at: index)
        }
        changes.signal()
    }

    /// Removes pending items carrying `tag`.
    func remove(tag: UInt64) {
        state.withLockedValue { $0.entries.removeAll { $0.tag == tag } }
        changes.signal()
    }

    /// Removes and returns pending items due after `time` (for traffic that a lost link never
    /// delivered).
    func take(after time: Duration) -> [Entry] {
        state.withLockedValue { s in
            let taken = s.entries.filter { $0.time > time && $0.tag == nil }
            s.entries.removeAll { $0.time > time && $0.tag == nil }
            return taken
        }
    }

    /// No more items after those queued.
    func close() {
        state.withLockedValue { $0.closed = true }
        changes.signal()
    }

    private enum Step { case deliver(Item), wait(Duration?), finished }

    /// The next item when it is due, or nil once closed and drained (or on cancellation).
    func next() async -> Item? {
        while !Task.isCancelled {
            let version = changes.version
            let now = clock.now
            let step = state.withLockedValue { s -> Step in
                guard let head = s.entries.first else { return s.closed ? .finished : .wait(nil) }
                let due = head.time <= now || (pacing == .instant && !head.waitsForClock)
                if due { s.entries.removeFirst(); return .deliver(head.item) }
                return .wait(head.time)
            }
            switch step {
            case .deliver(let item): return item
            case .finished: return nil
            case .wait(let deadline): await changes.wait(since: version, until: deadline, clock: clock)
            }
        }
        return nil
    }
}
