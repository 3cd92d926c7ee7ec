import BoxkeyBlueZ
import BoxkeyHost
import BoxkeyRadio
import BoxkeySimRadio

/// The radio this phone uses: BlueZ on a real adapter, or the simulated air shared with a box
/// on this machine. Only the simulated one can walk (`boxkey sim move`).
public final class PhoneRadio: Sendable {
    public let central: any CentralRadio
    /// The socket air and this phone's address on it, under the simulated radio.
    public let simulated: (air: SocketAir, address: DeviceAddress)?
    private let position: Double

    /// Opens the radio `backend` picks (see `RadioChoice`). `simPosition` is this phone's
    /// distance from the box on the simulated air (nil: where the last `sim move` put it, else 1 m).
    public static func open(_ backend: RadioChoice.Backend, adapter: String?, simDirectory: String?, simPosition: Double?,
                            identity: PhoneIdentity) async throws(PhoneFailure) -> PhoneRadio {
        do {
            switch try await RadioChoice.resolve(backend, adapter: adapter, simDirectory: simDirectory) {
            case .bluez(let adapter):
                do { return PhoneRadio(bluez: try await BlueZCentral(adapter: adapter)) } catch {
                    throw PhoneFailure(.radioUnavailable, tr("Bluetooth is unavailable: {why}. Check `systemctl status bluetooth` and `bluetoothctl show`; --radio simulated talks to a box on this machine.", ("why", "\(error)")))
                }
            case .simulated(let directory):
                let air = try RadioChoice.openSimulatedAir(directory)
                let address = identity.simulatedAddress
                let position = simPosition ?? SimMoves(directory: air.directory, address: address).position() ?? 1.0
                return PhoneRadio(air: air, address: address, position: position)
            }
        } catch let f as RadioChoice.Failure {
            throw PhoneFailure(.radioUnavailable, f.description)
        } catch let f as PhoneFailure {
            throw f
        } catch {
            throw PhoneFailure(.radioUnavailable, "\(error)")
        }
    }

    /// Simulated radio: walks this phone as `boxkey sim move` asked, if it asked since the last
    /// call (the presence link, or the agent while it holds none, calls this as it runs).
    public func followSimMove(log: (String) -> Void) {
        guard let (air, address) = simulated, let move = SimMoves(directory: air.directory, address: address).take() else { return }
        log("Walking to \(move.to) m over \(move.over) s…")
        air.air.move(address, to: move.to, over: .milliseconds(Int(move.over * 1000)))
    }

    init(bluez: BlueZCentral) {
        central = bluez
        simulated = nil
        position = 0
    }

    public init(air: SocketAir, address: DeviceAddress, position: Double) {
        central = air.central(address, at: position)
        simulated = (air, address)
        self.position = position
    }

    /// A central for finding the box again after a link loss: under the simulated radio, at
    /// the phone's current position.
    func centralForReattach() -> any CentralRadio {
        guard let (air, address) = simulated else { return central }
        return air.air.central(address, at: air.air.position(of: address) ?? position)
    }

    public func shutdown() {
        simulated?.air.shutdown()
        (central as? BlueZCentral)?.close()
    }
}
