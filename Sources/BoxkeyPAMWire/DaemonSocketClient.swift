#if canImport(Glibc)
import Glibc
#endif

/// A blocking client for the daemon's sockets with a deadline on every step: `poll`, never an
/// unbounded read. `boxkeyd`'s admin commands and its doctor use it on the admin socket; the
/// benchmarks on the PAM socket.
public final class DaemonSocketClient {
    public enum Error: Swift.Error, Equatable, CustomStringConvertible {
        /// No daemon listening (or no socket file).
        case unavailable(Int32)
        case timedOut
        case closed
        case protocolError(String)

        /// Words, not errno numbers: this reaches admins (`boxkeyd status`) and logs.
        public var description: String {
            switch self {
            case .unavailable(let e): String(cString: strerror(e))
            case .timedOut: "no answer in time"
            case .closed: "the daemon closed the connection"
            case .protocolError(let s): "protocol error: \(s)"
            }
        }
    }

    private var fd: Int32

    /// Connects without blocking: a missing or dead daemon fails at once, and so does a daemon
    /// that is alive but not accepting (stopped, wedged): its full listen queue gives EAGAIN,
    /// where a blocking connect would hang every sudo and login on the box.
    public init(path: String) throws(Error) {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw .unavailable(errno) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { Glibc.close(fd); throw .unavailable(ENAMETOOLONG) }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0 else {
            let e = errno
            Glibc.close(fd)
            throw .unavailable(e)
        }
    }

    deinit { if fd >= 0 { Glibc.close(fd) } }

    public func close() {
        if fd >= 0 { Glibc.close(fd); fd = -1 }
    }

    /// Sends one request, waiting at most `timeoutMilliseconds` for the socket to take it.
    public func send(_ request: AdminRequest, timeoutMilliseconds: Int32 = 1000) throws(Error) {
        var frame = request.encode()
        defer { for i in frame.indices { frame[i] = 0 } }
        try send(frame: &frame, timeoutMilliseconds: timeoutMilliseconds)
    }

    /// The encoded frame (a captured password in it) is this function's only copy, wiped after.
    public func send(_ request: PAMRequest, timeoutMilliseconds: Int32 = 1000) throws(Error) {
        var frame = request.encode()
        defer { for i in frame.indices { frame[i] = 0 } }
        try send(frame: &frame, timeoutMilliseconds: timeoutMilliseconds)
    }

    /// Reads the admin socket's reply (all its parts), waiting at most `timeoutMilliseconds` in total.
    public func receiveAdmin(timeoutMilliseconds: Int64) throws(Error) -> AdminReply {
        let deadline = monotonicMilliseconds() + timeoutMilliseconds
        var reader = AdminReply.Reader()
        while true {
            let body = try receiveFrame(timeoutMilliseconds: max(1, deadline - monotonicMilliseconds()))
            do {
                if let reply = try reader.read(body) { return reply }
            } catch { throw .protocolError("\(error)") }
        }
    }

    /// Reads the PAM socket's reply, waiting at most `timeoutMilliseconds` in total.
    public func receive(timeoutMilliseconds: Int64) throws(Error) -> PAMReply {
        var body = try receiveFrame(timeoutMilliseconds: timeoutMilliseconds)
        defer { for i in body.indices { body[i] = 0 } }
        do { return try PAMReply.decode(body) } catch { throw .protocolError("\(error)") }
    }

    private func send(frame bytes: inout [UInt8], timeoutMilliseconds: Int32) throws(Error) {
        var offset = 0
        while offset < bytes.count {
            try wait(for: Int16(POLLOUT), timeoutMilliseconds)
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EAGAIN || errno == EINTR { continue }
            guard n > 0 else { throw .closed }
            offset += n
        }
    }

    /// One frame's body (without its length).
    private func receiveFrame(timeoutMilliseconds: Int64) throws(Error) -> [UInt8] {
        let deadline = monotonicMilliseconds() + timeoutMilliseconds
        var header = try read(count: 2, deadline: deadline)
        let length = Int(header[0]) << 8 | Int(header[1])
        header = []
        guard length > 0, length <= PAMWire.maxFrameLength else { throw .protocolError("bad frame length \(length)") }
        return try read(count: length, deadline: deadline)
    }

    private func read(count: Int, deadline: Int64) throws(Error) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var offset = 0
        while offset < count {
            let remaining = deadline - monotonicMilliseconds()
            guard remaining > 0 else { throw .timedOut }
            try wait(for: Int16(POLLIN), Int32(min(remaining, Int64(Int32.max))))
            let n = out.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + offset, count - offset, 0) }
            if n < 0, errno == EAGAIN || errno == EINTR { continue }
            guard n > 0 else { throw .closed }
            offset += n
        }
        return out
    }

    private func wait(for events: Int16, _ timeout: Int32) throws(Error) {
        var p = pollfd(fd: fd, events: events, revents: 0)
        while true {
            let rc = poll(&p, 1, timeout)
            if rc < 0, errno == EINTR { continue }
            guard rc > 0 else { throw .timedOut }
            if p.revents & Int16(POLLNVAL) != 0 { throw .closed }
            if p.revents & events == 0, p.revents & Int16(POLLHUP | POLLERR) != 0 { throw .closed }
            return
        }
    }
}

func monotonicMilliseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}
