import BoxkeyRadio
import FoundationEssentials
import Glibc

/// `boxkey sim move` posts a walk in a file next to the simulated radio; the presence link
/// (`PresenceLink`) picks it up and moves the phone on the simulated air.
public struct SimMoves: Sendable {
    let path: String

    public init(directory: String, address: DeviceAddress) {
        path = "\(directory)/\(String(address.string.map { $0 == ":" ? "-" : $0 })).move"
    }

    public func post(to: Double, over: Double) {
        FileManager.default.createFile(atPath: path, contents: "\(to) \(over)".data(using: .utf8))
    }

    func take() -> (to: Double, over: Double)? {
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else { return nil }
        unlink(path)
        let parts = text.split(separator: " ").compactMap { Double($0) }
        return parts.count == 2 ? (parts[0], parts[1]) : nil
    }
}
