import CBoxkeySys
import Glibc

/// The process's signals as a stream, without Dispatch (whose signal sources would start its
/// thread pool and that pool's timer: see `QuietExecutors`).
///
/// A handler writes each signal's number to a pipe, and a thread of its own reads the pipe:
/// blocked in `read`, it costs nothing while no signal comes. Handlers, unlike a blocked mask, do
/// not pass to the programs a PAM module may exec.
public enum SignalPipe {
    public struct Caught: Sendable, Equatable {
        public let number: Int32
        /// When the reader took it from the pipe, in `SignalPipe.now()`'s nanoseconds.
        public let at: UInt64
    }

    public struct InstallError: Error, CustomStringConvertible {
        public let errno: Int32
        public var description: String { "cannot install signal handlers: \(String(cString: strerror(errno)))" }
    }

    /// Makes the pipe and returns what comes through it, in order; once per process. No signal
    /// is caught until `catchSignals`.
    public static func open() throws -> AsyncStream<Caught> {
        let fd = boxkey_signal_pipe()
        guard fd >= 0 else { throw InstallError(errno: errno) }
        let (stream, continuation) = AsyncStream.makeStream(of: Caught.self)
        let reader = Reader(fd: fd, continuation: continuation)
        if case .failure(let e) = startPlainThread(named: "signals", reader.run) { throw InstallError(errno: e.code) }
        return stream
    }

    /// From now on these signals go through the pipe instead of their default actions.
    public static func catchSignals(_ signals: [Int32]) throws {
        for signal in signals where boxkey_catch_signal(signal) != 0 { throw InstallError(errno: errno) }
    }

    /// CLOCK_MONOTONIC, in nanoseconds: the clock of `Caught.at`.
    public static func now() -> UInt64 { monotonicNanoseconds() }

    private final class Reader {
        let fd: Int32
        let continuation: AsyncStream<Caught>.Continuation
        init(fd: Int32, continuation: AsyncStream<Caught>.Continuation) {
            self.fd = fd
            self.continuation = continuation
        }

        func run() {
            var byte: UInt8 = 0
            while true {
                let n = read(fd, &byte, 1)
                if n == 1 { continuation.yield(Caught(number: Int32(byte), at: monotonicNanoseconds())) }
                else if n < 0 && errno == EINTR { continue }
                else { continuation.finish(); return }
            }
        }
    }
}
