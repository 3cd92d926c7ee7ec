import Glibc

/// One agent per user: an exclusive `flock` on the runtime directory, held for the agent's
/// whole life. Checking for a running agent and then starting one leaves a window (the PIN's
/// Argon2id is half a second); two agents started in it would each take the socket path, and
/// the first, holding a password, could no longer be reached by `forget`, `lock` or `stop`.
public final class AgentInstance {
    private var fd: Int32

    /// Takes the lock, or fails at once with `.agentRunning` when another agent holds it.
    public init(_ dirs: PhoneDirectories) throws(PhoneFailure) {
        do { try dirs.ensureRuntime() } catch { throw PhoneFailure(.failure, "\(error)") }
        let fd = open(dirs.runtime, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw PhoneFailure(.failure, "cannot open \(dirs.runtime): \(String(cString: strerror(errno)))") }
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let e = errno
            if e == EINTR { continue }
            close(fd)
            if e == EWOULDBLOCK { throw PhoneFailure(.failure, "an agent is already running (boxkey agent status)") }
            throw PhoneFailure(.failure, "cannot lock \(dirs.runtime): \(String(cString: strerror(e)))")
        }
        self.fd = fd
    }

    /// Lets another agent start (the process ending does the same).
    public func release() {
        if fd >= 0 { close(fd) }
        fd = -1
    }

    deinit { release() }
}
