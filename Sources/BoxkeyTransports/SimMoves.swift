import BoxkeyRadio
import FoundationEssentials
import Glibc

/// `boxkey sim move` posts a walk in a file next to the simulated radio; the presence link
/// (`PresenceLink`) picks it up and moves the phone on the simulated air. Where the walk ends is
/// kept beside it, so every later command (scan, login, an agent) starts the phone there.
public struct SimMoves: Sendable {
    let path: String
    let positionPath: String

    public init(directory: String, address: DeviceAddress) {
        let name = String(address.string.map { $0 == ":" ? "-" : $0 })
        path = "\(directory)/\(name).move"
        positionPath = "\(directory)/\(name).position"
    }

    public func post(to: Double, over: Double) {
        // The position first: a command starting meanwhile finds the phone where it is going.
        _ = FileManager.default.createFile(atPath: positionPath, contents: "\(to)".data(using: .utf8))
        _ = FileManager.default.createFile(atPath: path, contents: "\(to) \(over)".data(using: .utf8))
    }

    /// Where the last `sim move` put this phone, if one did.
    public func position() -> Double? {
        guard let data = FileManager.default.contents(atPath: positionPath), let text = String(data: data, encoding: .utf8),
              let metres = Double(text.filter { !$0.isWhitespace }), metres.isFinite, metres >= 0 else { return nil }
        return metres
    }

    func take() -> (to: Double, over: Double)? {
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else { return nil }
        unlink(path)
        let parts = text.split(separator: " ").compactMap { Double($0) }
        return parts.count == 2 ? (parts[0], parts[1]) : nil
    }
}
