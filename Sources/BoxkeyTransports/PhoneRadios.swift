import BoxkeyBlueZ
import BoxkeyCore
import BoxkeyHost
import BoxkeyPhone
import BoxkeyRadio
import NIOConcurrencyHelpers
import BoxkeySimRadio

/// Opens the phone's radio: BlueZ on a real adapter, or the simulated air shared with a box on
/// this machine (see `RadioChoice`).
public enum PhoneRadios {
    /// `simPosition` is this phone's distance from the box on the simulated air (nil: where the
    /// last `sim move` put it, else 1 m).
    public static func open(_ backend: RadioBackend, adapter: String?, simDirectory: String?, simPosition: Double?,
                            identity: PhoneIdentity) async throws(PhoneFailure) -> any PhoneRadio {
        do {
            switch try await RadioChoice.resolve(backend, adapter: adapter, simDirectory: simDirectory) {
            case .bluez(let adapter):
                do { return BlueZPhoneRadio(try await BlueZCentral(adapter: adapter)) } catch {
                    throw PhoneFailure(.radioUnavailable, tr("Bluetooth is unavailable: {why}. Check `systemctl status bluetooth` and `bluetoothctl show`; --radio simulated talks to a box on this machine.", ("why", "\(error)")))
                }
            case .simulated(let directory):
                let air = try RadioChoice.openSimulatedAir(directory)
                let address = identity.simulatedAddress
                let position = simPosition ?? SimMoves(directory: air.directory, address: address).position() ?? 1.0
                return SimulatedPhoneRadio(air: air, address: address, position: position)
            }
        } catch let f as RadioChoice.Failure {
            throw PhoneFailure(.radioUnavailable, f.description)
        } catch let f as PhoneFailure {
            throw f
        } catch {
            throw PhoneFailure(.radioUnavailable, "\(error)")
        }
    }
}

/// The phone on BlueZ: one central for everything.
public final class BlueZPhoneRadio: PhoneRadio {
    private let bluez: BlueZCentral
    public var central: any CentralRadio { bluez }

    init(_ bluez: BlueZCentral) { self.bluez = bluez }

    public var canWalk: Bool { false }
    public func centralForReattach() -> any CentralRadio { bluez }
    public func followMoves(log: (String) -> Void) {}
    public func shutdown() { bluez.close() }
}

/// The phone on the simulated air, at a distance from the box that `boxkey sim move` changes.
public final class SimulatedPhoneRadio: PhoneRadio {
    public let air: SocketAir
    public let address: DeviceAddress
    public let central: any CentralRadio
    private let position: Double

    /// The walk this process followed last: a walk posted before it started is where it
    /// starts (`SimMoves.position`), not one to follow.
    private let followed: NIOLockedValueBox<String?>

    public init(air: SocketAir, address: DeviceAddress, position: Double) {
        self.air = air
        self.address = address
        self.position = position
        central = air.central(address, at: position)
        followed = NIOLockedValueBox(SimMoves(directory: air.directory, address: address).current())
    }

    public var canWalk: Bool { true }

    public func followMoves(log: (String) -> Void) {
        let moves = SimMoves(directory: air.directory, address: address)
        guard let text = moves.current(), followed.withLockedValue({ $0 }) != text else { return }
        followed.withLockedValue { $0 = text }
        guard let move = SimMoves.parse(text) else { return }
        log("Walking to \(move.to) m over \(move.over) s…")
        air.air.move(address, to: move.to, over: .milliseconds(Int(move.over * 1000)))
    }

    public func centralForReattach() -> any CentralRadio {
        air.air.central(address, at: air.air.position(of: address) ?? position)
    }

    public func shutdown() { air.shutdown() }
}

extension PhoneIdentity {
    /// A stable simulated-radio address for this phone.
    public var simulatedAddress: DeviceAddress {
        let h = Blake2b.hash(keyPair.publicKey.bytes, outputLength: 3)
        let hex = h.prefix(3).map { ($0 < 16 ? "0" : "") + String($0, radix: 16, uppercase: true) }
        return DeviceAddress("00:50:48:" + hex.joined(separator: ":"))!
    }
}
