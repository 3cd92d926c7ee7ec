import BoxkeyBlueZ
import BoxkeyPhone
import BoxkeyRadio
import BoxkeySimRadio

/// The radio this phone uses: BlueZ on a real adapter, or the simulated air shared with a box
/// on this machine. Only the simulated one can walk (`boxkey sim move`).
final class PhoneRadio: @unchecked Sendable {
    let central: any CentralRadio
    /// The socket air and this phone's address on it, under the simulated radio.
    let simulated: (air: SocketAir, address: DeviceAddress)?

    init(bluez: BlueZCentral) {
        central = bluez
        simulated = nil
    }

    init(air: SocketAir, address: DeviceAddress, position: Double) {
        central = air.central(address, at: position)
        simulated = (air, address)
    }

    /// A central for finding the box again after a link loss: under the simulated radio, at
    /// the phone's current position.
    func centralForReattach(defaultPosition: Double) -> any CentralRadio {
        guard let (air, address) = simulated else { return central }
        return air.air.central(address, at: air.air.position(of: address) ?? defaultPosition)
    }

    func shutdown() {
        simulated?.air.shutdown()
        (central as? BlueZCentral)?.close()
    }
}
