import BoxkeyTestWorlds
import Foundation
import Testing

/// The fixtures' signal state. A test's thread may block SIGTERM (libdispatch's workers block
/// every signal); fixtures started from such a thread with Foundation's `Process` inherited the
/// mask, ignored timeout(1)'s SIGTERM and outlived the test run by hours.
@Suite struct FixtureProcessTests {
    /// Runs `body` with SIGTERM blocked on this thread, as on a libdispatch worker.
    func withSIGTERMBlocked<T>(_ body: () throws -> T) rethrows -> T {
        var term = sigset_t(), old = sigset_t()
        sigemptyset(&term)
        sigaddset(&term, SIGTERM)
        pthread_sigmask(SIG_BLOCK, &term, &old)
        defer { pthread_sigmask(SIG_SETMASK, &old, nil) }
        return try body()
    }

    @Test func aFixtureStartsWithNoSignalBlockedAndTheDefaultsReset() throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let output = directory + "/status"
        let child = try withSIGTERMBlocked {
            try FixtureProcess(["/usr/bin/grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status"], output: output)
        }
        #expect(child.wait(within: .seconds(10)) == 0)
        let fields = Dictionary(uniqueKeysWithValues: try String(contentsOfFile: output, encoding: .utf8)
            .split(separator: "\n").map { line in
                let parts = line.split(separator: ":")
                return (String(parts[0]), UInt64(parts[1].trimmingCharacters(in: .whitespaces), radix: 16) ?? .max)
            })
        #expect(fields["SigBlk"] == 0)
        let reset = FixtureProcess.defaultSignals.reduce(UInt64(0)) { $0 | 1 << UInt64($1 - 1) }
        #expect(fields["SigIgn"].map { $0 & reset } == 0)
    }

    @Test func terminateEndsTheWrapperAndWhatItRuns() throws {
        let child = try withSIGTERMBlocked { try FixtureProcess(["/usr/bin/timeout", "600", "/usr/bin/sleep", "600"]) }
        // timeout(1)'s child, once it has forked it.
        var sleeper: pid_t?
        for _ in 0..<500 where sleeper == nil {
            let children = PrivateBus.read("/proc/\(child.pid)/task/\(child.pid)/children") ?? ""
            sleeper = children.split(separator: " ").first.flatMap { pid_t($0) }
            if sleeper == nil { usleep(10_000) }
        }
        let status = child.terminate(grace: .seconds(5))
        // Ended by the SIGTERM (timeout re-raises its child's signal, or exits 128 + 15), not
        // by the SIGKILL that follows the grace period.
        #expect(status & 0x7f == SIGTERM || status >> 8 == 128 + SIGTERM, "wait status \(status)")
        let sleepPid = try #require(sleeper)
        // Orphaned by timeout(1), the killed child is reaped by init, not by us: give it a moment.
        for _ in 0..<200 where kill(sleepPid, 0) == 0 { usleep(10_000) }
        #expect(kill(sleepPid, 0) == -1 && errno == ESRCH)
    }
}
