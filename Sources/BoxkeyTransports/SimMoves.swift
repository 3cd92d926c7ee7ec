import BoxkeyRadio
import FoundationEssentials
import Glibc

/// `boxkey sim move` posts a walk in a file next to the simulated radio; every running process
/// of that phone (a presence link, an agent, `scan --watch`) picks it up and moves the phone on
/// its simulated air. The walk stays in the file, stamped: each process follows each walk once
/// (a walk taken by the first reader left the others where they were). Where the walk ends is
/// kept beside it, so every later command starts the phone there.
public struct SimMoves: Sendable {
    let path: String
    let positionPath: String

    public init(directory: String, address: DeviceAddress) {
        let name = String(address.string.map { $0 == ":" ? "-" : $0 })
        path = "\(directory)/\(name).move"
        positionPath = "\(directory)/\(name).position"
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Posts a walk to `to` metres over `over` seconds; a folder it cannot write is an error.
    public func post(to: Double, over: Double) throws(Failure) {
        // The position first: a command starting meanwhile finds the phone where it is going.
        try write("\(to)", to: positionPath)
        var stamp = timespec()
        clock_gettime(CLOCK_REALTIME, &stamp)
        try write("\(to) \(over) \(stamp.tv_sec).\(stamp.tv_nsec).\(getpid())", to: path)
    }

    private func write(_ text: String, to file: String) throws(Failure) {
        let temporary = file + ".tmp-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw Failure(description: "cannot write \(file): \(String(cString: strerror(errno)))") }
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress!, $0.count) }
        close(fd)
        guard written == bytes.count, rename(temporary, file) == 0 else {
            let why = String(cString: strerror(errno))
            unlink(temporary)
            throw Failure(description: "cannot write \(file): \(why)")
        }
    }

    /// Where the last `sim move` put this phone, if one did.
    public func position() -> Double? {
        guard let data = FileManager.default.contents(atPath: positionPath), let text = String(data: data, encoding: .utf8),
              let metres = Double(text.filter { !$0.isWhitespace }), metres.isFinite, metres >= 0 else { return nil }
        return metres
    }

    /// The walk posted last, as its stamped text (nil: none).
    func current() -> String? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return String(data: data, encoding: .utf8)
    }

    /// A walk's target and time, from its text.
    static func parse(_ text: String) -> (to: Double, over: Double)? {
        let parts = text.split(separator: " ")
        guard parts.count >= 2, let to = Double(parts[0]), let over = Double(parts[1]), to.isFinite, to >= 0, over.isFinite, over >= 0 else { return nil }
        return (to, over)
    }
}
