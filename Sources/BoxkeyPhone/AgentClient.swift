import BoxkeyCore
import CBoxkeySys
import Glibc

/// `boxkey`'s side of the agent socket: blocking, one request per connection. It talks only to
/// an agent of this user — the socket's peer is checked with SO_PEERCRED — so another account
/// cannot stand in for the agent and collect a PIN.
public final class AgentClient: Sendable {
    private let fd: Int32

    /// Connects to this user's agent, or returns nil when none is running.
    public convenience init?(_ dirs: PhoneDirectories) {
        self.init(path: dirs.agentSocket)
    }

    /// Connects to the socket at `path` (the agent's, or a presence link's holder), or returns
    /// nil when nobody of this user serves on it.
    public init?(path: String) {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { Glibc.close(fd); return nil }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0, boxkey_peer_uid(fd) == Int64(getuid()) else { Glibc.close(fd); return nil }
    }

    deinit { Glibc.close(fd) }

    /// Ends this side's sending (the agent reads the end as the client going away: a login's
    /// push still waiting for Enter is taken back) while the answer can still be read. Safe to
    /// call from another thread during `send`.
    public func stopAsking() { _ = shutdown(fd, Int32(SHUT_WR)) }

    /// Sends `request`, hands each progress line to `progress`, and returns the final reply
    /// (`result` or `needPIN`). A silent agent is given `timeout` in total.
    public func send(_ request: AgentRequest, timeout: Duration = .seconds(120),
                     progress: (String) -> Void = { _ in }, say: (String) -> Void = { _ in }) throws(PhoneFailure) -> AgentReply {
        let frame = request.frame()
        let sent = frame.withUnsafeBytes { b in
            var at = 0
            while at < b.count {
                let n = Glibc.send(fd, b.baseAddress! + at, b.count - at, Int32(MSG_NOSIGNAL))
                if n < 0, errno == EINTR { continue }
                guard n > 0 else { return false }
                at += n
            }
            return true
        }
        guard sent else { throw PhoneFailure(.agentUnavailable, "the agent closed the connection") }
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while true {
            let reply = try receive(until: deadline, clock: clock)
            if case .progress(let line) = reply { progress(line); continue }
            if case .say(let line) = reply { say(line); continue }
            return reply
        }
    }

    private func receive(until deadline: ContinuousClock.Instant, clock: ContinuousClock) throws(PhoneFailure) -> AgentReply {
        let header = try read(2, until: deadline, clock: clock)
        let length = Int(header[0]) << 8 | Int(header[1])
        guard length > 0, length <= AgentWire.maxFrameLength else { throw PhoneFailure(.failure, "the agent sent a malformed reply") }
        let body = try read(length, until: deadline, clock: clock)
        do { return try body.withUnsafeBytes { b throws(AgentWire.DecodeError) in try AgentReply.decode(b) } } catch {
            throw PhoneFailure(.failure, "the agent sent a malformed reply (\(error))")
        }
    }

    private func read(_ count: Int, until deadline: ContinuousClock.Instant, clock: ContinuousClock) throws(PhoneFailure) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var at = 0
        while at < count {
            let left = deadline - clock.now
            guard left > .zero else { throw PhoneFailure(.timedOut, "the agent did not answer in time") }
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ms = Int32(min(left.components.seconds * 1000 + 1, 60_000))
            let rc = poll(&p, 1, ms)
            if rc < 0, errno == EINTR { continue }
            guard rc > 0 else { continue }
            let n = out.withUnsafeMutableBytes { Glibc.recv(fd, $0.baseAddress! + at, count - at, 0) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw PhoneFailure(.agentUnavailable, tr("the agent went away")) }
            at += n
        }
        return out
    }
}
