import BoxkeyBlueZ
import BoxkeyHost
import BoxkeyRadio
import BoxkeySimRadio

/// Which radio a process uses, decided the same way by the box and the phone.
public enum RadioChoice: Equatable, Sendable {
    case bluez(adapter: String?)
    case simulated(directory: String)

    public typealias Backend = RadioBackend

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// `auto` is BlueZ when bluetoothd has the adapter (any adapter, if none is named), the
    /// simulated radio otherwise; a named adapter that is missing is an error, not a fallback.
    public static func resolve(_ backend: Backend, adapter: String?, simDirectory: String?) async throws(Failure) -> RadioChoice {
        let adapter = adapter.flatMap { $0.isEmpty ? nil : $0 }
        let directory = simDirectory.flatMap { $0.isEmpty ? nil : $0 } ?? SocketAir.defaultDirectory
        switch backend {
        case .bluez: return .bluez(adapter: adapter)
        case .simulated: return .simulated(directory: directory)
        case .auto:
            if await blueZAdapterPresent(named: adapter) { return .bluez(adapter: adapter) }
            if let adapter { throw Failure(description: "no Bluetooth adapter \(adapter) (is bluetoothd running?)") }
            return .simulated(directory: directory)
        }
    }

    /// The simulated radio's shared air in `directory`.
    public static func openSimulatedAir(_ directory: String, parameters: SimulationParameters = SimulationParameters()) throws(Failure) -> SocketAir {
        do { return try SocketAir(directory: directory, parameters: parameters) } catch {
            throw Failure(description: "the simulated radio is unavailable: \(error)")
        }
    }
}
