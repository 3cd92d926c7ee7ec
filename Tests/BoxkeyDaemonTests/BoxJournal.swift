import BoxkeyTestWorlds
import Foundation
import Logging
import NIOConcurrencyHelpers
import Testing

/// The box's log in a test: every line it writes, at every level, and a wait for the line a
/// test expects. A test that must know the box has seen something (a link close, a reading,
/// a lock confirmed) waits for the box to say so, never for the clock.
/// `BOXKEY_TEST_LOG=debug` also prints the lines.
final class BoxJournal: Sendable {
    struct Line: Sendable, CustomStringConvertible {
        let level: Logger.Level
        let message: String
        /// The audit event (`boxkey_event`), if the line is one.
        let event: String?
        /// The phone's fingerprint (`boxkey_phone`), if the line names one.
        var phone: String? = nil
        var description: String { "[\(level)] \(event.map { "\($0): " } ?? "")\(message)" }
    }

    private struct Waiter {
        let from: Int
        let matches: @Sendable (Line) -> Bool
        let continuation: CheckedContinuation<Line, any Error>
    }
    private struct State {
        var lines: [Line] = []
        var waiters: [UInt64: Waiter] = [:]
        var nextID: UInt64 = 0
    }
    private let state = NIOLockedValueBox(State())
    private let printLevel = ProcessInfo.processInfo.environment["BOXKEY_TEST_LOG"].flatMap(Logger.Level.init(rawValue:))

    /// A logger that writes here.
    func logger(_ label: String = "box") -> Logger {
        Logger(label: label) { _ in Handler(journal: self) }
    }

    /// How many lines there are so far: `line(after:)` from here sees only what comes next.
    var mark: Int { state.withLockedValue { $0.lines.count } }

    var lines: [Line] { state.withLockedValue { $0.lines } }

    /// The first line from `mark` on that `matches`: one already written, or the next to come.
    /// Fails after `timeout` (a test that passes never waits it out: it only bounds a failure).
    @discardableResult
    func line(after mark: Int = 0, timeout: Duration = .seconds(10), sourceLocation: SourceLocation = #_sourceLocation,
              _ matches: @escaping @Sendable (Line) -> Bool) async throws -> Line {
        let id = state.withLockedValue { s -> UInt64 in s.nextID += 1; return s.nextID }
        let (seconds, attoseconds) = timeout.components
        DispatchQueue.global().asyncAfter(deadline: .now() + Double(seconds) + Double(attoseconds) / 1e18) { [self] in
            guard let w = state.withLockedValue({ $0.waiters.removeValue(forKey: id) }) else { return }
            w.continuation.resume(throwing: TestFailure("no such line from the box within \(timeout); it wrote:\n"
                + lines.dropFirst(w.from).map(\.description).joined(separator: "\n")))
        }
        return try await withCheckedThrowingContinuation { c in
            let found = state.withLockedValue { s -> Line? in
                if let hit = s.lines.dropFirst(mark).first(where: matches) { return hit }
                s.waiters[id] = Waiter(from: mark, matches: matches, continuation: c)
                return nil
            }
            if let found { c.resume(returning: found) }
        }
    }

    /// The first line from `mark` on that contains every one of `words`.
    @discardableResult
    func line(after mark: Int = 0, containing words: String..., timeout: Duration = .seconds(10)) async throws -> Line {
        try await line(after: mark, timeout: timeout) { line in words.allSatisfy { line.message.contains($0) } }
    }

    fileprivate func append(_ line: Line) {
        if let printLevel, line.level >= printLevel { print("box: \(line)") }
        let woken = state.withLockedValue { s -> [CheckedContinuation<Line, any Error>] in
            s.lines.append(line)
            let index = s.lines.count - 1
            let due = s.waiters.filter { $0.value.from <= index && $0.value.matches(line) }
            for id in due.keys { s.waiters[id] = nil }
            return due.values.map(\.continuation)
        }
        for c in woken { c.resume(returning: line) }
    }

    private struct Handler: LogHandler {
        let journal: BoxJournal
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        var metadataProvider: Logger.MetadataProvider?
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            var audit: String?
            if case .string(let name)? = event.metadata?["boxkey_event"] ?? metadata["boxkey_event"] { audit = name }
            var phone: String?
            if case .string(let fingerprint)? = event.metadata?["boxkey_phone"] { phone = fingerprint }
            journal.append(Line(level: event.level, message: "\(event.message)", event: audit, phone: phone))
        }
    }
}
