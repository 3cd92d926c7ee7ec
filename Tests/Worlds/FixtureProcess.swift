import CBoxkeySys
import Foundation

/// A process a test starts (dbus-daemon, bluezoo) and stops when it ends: `terminate()` sends
/// SIGTERM and waits for it, SIGKILL after a bound.
///
/// Started with posix_spawn rather than Foundation's `Process`, for the signal state: a test
/// runs on threads that block signals (Swift concurrency's pool threads, libdispatch workers,
/// block nearly all of them, SIGTERM included), and a child keeps its spawning thread's mask
/// and every ignored signal across exec (POSIX `execve`: "signals set to be ignored ... shall
/// be set to be ignored", "the new process shall inherit ... the signal mask"). A fixture
/// started that way never got SIGTERM — neither ours nor timeout(1)'s — and outlived the test
/// run by hours. Here the child starts with an empty mask and
/// `defaultSignals` at SIG_DFL (POSIX_SPAWN_SETSIGMASK, POSIX_SPAWN_SETSIGDEF), in a process
/// group of its own (POSIX_SPAWN_SETPGROUP) so that SIGKILL reaches a wrapper such as timeout(1)
/// and what it runs together.
public final class FixtureProcess: @unchecked Sendable {
    public let pid: pid_t
    public let command: String
    private var status: Int32?
    private let lock = NSLock()

    /// Reset to their default action in the child, whatever the test process did with them.
    public static let defaultSignals = [SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGALRM, SIGCHLD, SIGUSR1, SIGUSR2]

    /// Starts `arguments[0]` (an absolute path). Standard input is /dev/null; standard output
    /// and error go to `output` (appended) or /dev/null; `extraFiles[fd]` is opened for writing
    /// (created, truncated) as descriptor `fd` (for dbus-daemon's `--print-address=FD`).
    public init(_ arguments: [String], environment: [String: String]? = nil, output: String? = nil, extraFiles: [Int32: String] = [:]) throws {
        command = arguments.joined(separator: " ")
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, output ?? "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        for (fd, path) in extraFiles { posix_spawn_file_actions_addopen(&actions, fd, path, O_WRONLY | O_CREAT | O_TRUNC, 0o644) }
        // Nothing else of the test process's: a pipe end held by a fixture keeps its reader
        // (swift test's event stream, a peer's standard input) from ever seeing the end.
        boxkey_posix_spawn_close_from(&actions, (extraFiles.keys.max() ?? 2) + 1)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t(), defaults = sigset_t()
        sigemptyset(&none)
        sigemptyset(&defaults)
        for s in Self.defaultSignals { sigaddset(&defaults, s) }
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))

        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let envp = environment.map { $0.map { strdup("\($0.key)=\($0.value)") } + [nil] }
        defer { envp?.forEach { free($0) } }
        var child: pid_t = 0
        let rc = envp.map { posix_spawn(&child, arguments[0], &actions, &attributes, argv, $0) }
            ?? posix_spawn(&child, arguments[0], &actions, &attributes, argv, environ)
        guard rc == 0 else { throw TestFailure("cannot start \(command): \(String(cString: strerror(rc)))") }
        pid = child
    }

    /// Whether it still runs (reaps it if it has ended).
    public var isRunning: Bool {
        lock.withLock { reap(wait: false) == nil }
    }

    /// Waits up to `timeout` for it to end by itself; its wait(2) status, or nil if it still runs.
    public func wait(within timeout: Duration) -> Int32? {
        lock.withLock { reap(within: timeout) }
    }

    /// SIGTERM to its process group, then waits up to `grace` for it; SIGKILL to the group
    /// after that, and to whatever of the group outlived it. The whole group, not the wrapper
    /// alone: timeout(1) forwards SIGTERM only once it has recorded its child's pid, and a
    /// SIGTERM just before that left the child running (seen in CI). Returns the wait(2)
    /// status. Safe to call again: later calls return the same status.
    @discardableResult
    public func terminate(grace: Duration = .seconds(5)) -> Int32 {
        lock.withLock {
            if let status { return status }
            kill(-pid, SIGTERM)
            let s = reap(within: grace) ?? {
                kill(-pid, SIGKILL)
                return reap(wait: true) ?? -1
            }()
            kill(-pid, SIGKILL)  // no one left is the usual answer (ESRCH)
            return s
        }
    }

    private func reap(within timeout: Duration) -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let s = reap(wait: false) { return s }
            if ContinuousClock.now >= deadline { return nil }
            usleep(10_000)
        }
    }

    /// The status once it has ended; nil while it runs (and `wait` is false).
    private func reap(wait: Bool) -> Int32? {
        if let status { return status }
        var s: Int32 = 0
        var r: pid_t
        repeat { r = waitpid(pid, &s, wait ? 0 : WNOHANG) } while r < 0 && errno == EINTR
        if r == pid { status = s } else if r < 0 { status = -1 }
        return status
    }

    /// The last resort, for a test that did not stop it.
    deinit { terminate() }
}
