import BoxkeyCore
import CBoxkeySys
import BoxkeyHost
import FoundationEssentials
import Glibc

/// Starting a process that outlives the command (`boxkey agent start`): the child runs in its
/// own session with a clean signal mask, gets a secret (the PIN) on its standard input, and its
/// first lines are relayed until it says it is ready.
public enum Detached {
    /// Spawns `arguments`, writes `input` to its standard input, relays its output until a line
    /// contains `ready` (returns 0: the child runs on) or it exits (returns its status).
    public static func spawn(_ arguments: [String], input: SecureBytes?, ready: String) -> Int32 {
        var stdinPipe: [Int32] = [0, 0], stdoutPipe: [Int32] = [0, 0]
        guard pipe(&stdinPipe) == 0, pipe(&stdoutPipe) == 0 else { return 1 }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, stdinPipe[0], 0)
        posix_spawn_file_actions_adddup2(&actions, stdoutPipe[1], 1)
        posix_spawn_file_actions_adddup2(&actions, stdoutPipe[1], 2)
        // Nothing else this process holds open goes along: a pipe of whoever started us would
        // otherwise stay open for the agent's whole life, and they would wait for its end.
        _ = boxkey_posix_spawn_close_from(&actions, 3)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // A clean signal mask and default dispositions: this process may block or ignore
        // signals (SIGTERM, SIGXFSZ) the child must see.
        var empty = sigset_t(), defaults = sigset_t()
        sigemptyset(&empty)
        sigemptyset(&defaults)
        for s in [SIGTERM, SIGINT, SIGHUP, SIGXFSZ, SIGPIPE] { sigaddset(&defaults, s) }
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, boxkey_posix_spawn_setsid() | Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var pid: pid_t = 0
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let rc = posix_spawn(&pid, arguments[0], &actions, &attributes, argv, environ)
        close(stdinPipe[0]); close(stdoutPipe[1])
        guard rc == 0 else { close(stdinPipe[1]); close(stdoutPipe[0]); return 1 }
        if let input {
            input.withUnsafeBytes { _ = write(stdinPipe[1], $0.baseAddress, $0.count) }
            _ = write(stdinPipe[1], "\n", 1)
        }
        close(stdinPipe[1])
        defer { close(stdoutPipe[0]) }
        var seen: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(stdoutPipe[0], &chunk, chunk.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            seen += chunk[..<n]
            Console.write(1, Array(chunk[..<n]))
            if String(decoding: seen, as: UTF8.self).contains(ready) { return 0 }
        }
        // It ended without saying it was ready: its exit status, or failure if a signal ended
        // it (status 0 would read as success).
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        let signalled = status & 0x7f != 0
        let code = (status >> 8) & 0xff
        return signalled || code == 0 ? 1 : code
    }

    /// In the child, once ready: output goes to `log` (0600) from now on, input is /dev/null.
    public static func redirectOutput(to log: String) {
        let fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        if fd >= 0 { dup2(fd, 1); dup2(fd, 2); close(fd) }
        let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
        if null >= 0 { dup2(null, 0); close(null) }
    }
}
