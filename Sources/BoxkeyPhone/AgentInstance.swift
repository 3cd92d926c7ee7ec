import Glibc

/// One agent per phone: an exclusive `flock` on the phone's config directory (where its key
/// is), held for the agent's whole life. Not the runtime directory: that one differs between
/// environments (with and without `XDG_RUNTIME_DIR`) and logind removes and recreates it, and
/// a second agent in a new one would leave the first unreachable. Checking for a running agent and then starting one leaves a window (the PIN's
/// Argon2id is half a second); two agents started in it would each take the socket path, and
/// the first, holding a password, could no longer be reached by `forget`, `lock` or `stop`.
public final class AgentInstance {
    private var fd: Int32

    /// Takes the lock, or fails at once with `.agentRunning` when another agent holds it.
    public init(_ dirs: PhoneDirectories) throws(PhoneFailure) {
        do { try dirs.ensure() } catch { throw PhoneFailure(.failure, "\(error)") }
        let fd = open(dirs.config, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw PhoneFailure(.failure, "cannot open \(dirs.config): \(String(cString: strerror(errno)))") }
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let e = errno
            if e == EINTR { continue }
            close(fd)
            if e == EWOULDBLOCK { throw PhoneFailure(.failure, "an agent is already running (boxkey agent status)") }
            throw PhoneFailure(.failure, "cannot lock \(dirs.config): \(String(cString: strerror(e)))")
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
