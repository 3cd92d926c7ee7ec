import CBoxkeySys
import Glibc

/// The process's signals as a stream, without Dispatch (whose signal sources would start its
/// thread pool and that pool's timer: see `QuietExecutors`).
///
/// A handler writes each signal's number to a pipe, and a thread of its own reads the pipe:
/// blocked in `read`, it costs nothing while no signal comes. Handlers, unlike a blocked mask, do
/// not pass to the programs a PAM module may exec.
public enum SignalPipe {
    public struct InstallError: Error, CustomStringConvertible {
        public let errno: Int32
        public var description: String { "cannot install signal handlers: \(String(cString: strerror(errno)))" }
    }

    /// Handles `signals` from now on and returns them in the order they came; once per process.
    public static func install(_ signals: [Int32]) throws -> AsyncStream<Int32> {
        let fd = signals.withUnsafeBufferPointer { boxkey_signal_pipe($0.baseAddress, Int32($0.count)) }
        guard fd >= 0 else { throw InstallError(errno: errno) }
        let (stream, continuation) = AsyncStream.makeStream(of: Int32.self)
        let reader = Reader(fd: fd, continuation: continuation)
        var thread = pthread_t()
        let rc = pthread_create(&thread, nil, { raw in
            Unmanaged<Reader>.fromOpaque(raw!).takeRetainedValue().run()
            return nil
        }, Unmanaged.passRetained(reader).toOpaque())
        guard rc == 0 else { throw InstallError(errno: rc) }
        pthread_detach(thread)
        return stream
    }

    private final class Reader {
        let fd: Int32
        let continuation: AsyncStream<Int32>.Continuation
        init(fd: Int32, continuation: AsyncStream<Int32>.Continuation) {
            self.fd = fd
            self.continuation = continuation
        }

        func run() {
            var byte: UInt8 = 0
            while true {
                let n = read(fd, &byte, 1)
                if n == 1 { continuation.yield(Int32(byte)) }
                else if n < 0 && errno == EINTR { continue }
                else { continuation.finish(); return }
            }
        }
    }
}
