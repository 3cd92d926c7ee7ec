import BoxkeyTestWorlds
import BoxkeyBlueZ
import BoxkeyRadio
import BoxkeySimRadio
import Foundation
import Testing

/// A GATT service shaped like Boxkey's, for radio tests that must not depend on the protocol.
enum TestService {
    static let service = "0000aaaa-0000-1000-8000-00805f9b34fb"
    static let info = "0000aaa1-0000-1000-8000-00805f9b34fb"
    static let request = "0000aaa2-0000-1000-8000-00805f9b34fb"
    static let response = "0000aaa3-0000-1000-8000-00805f9b34fb"
    static let infoValue: [UInt8] = Array(0..<36)

    static var definition: GATTService {
        GATTService(uuid: service, characteristics: [
            GATTCharacteristic(uuid: info, properties: .read, value: infoValue),
            GATTCharacteristic(uuid: request, properties: [.write, .writeWithoutResponse]),
            GATTCharacteristic(uuid: response, properties: .notify),
        ])
    }

    static var advertising: AdvertisingData {
        AdvertisingData(serviceUUIDs: [service], manufacturerData: [0xFFFF: [0x10, 0x12, 0xD5, 0, 1, 0x42]])
    }
}

let boxAddress = DeviceAddress("00:AA:01:00:00:00")!
let phoneAddress = DeviceAddress("00:AA:01:01:00:01")!

/// Which radio a test body runs against.
enum Backend: String, CaseIterable, CustomTestStringConvertible, Sendable {
    /// In-process air, manual clock, instant pacing: connection events are counted, not waited for.
    case inProcess
    /// Two `SocketAir`s talking through Unix sockets in a private directory, real clock.
    case crossProcess
    /// The BlueZ transport against bluezoo (a BlueZ D-Bus mock) on a private bus: real D-Bus
    /// calls, signals and exported objects; no radio timing, RSSI or MTU limits.
    case bluezoo

    /// Whether the backend models the radio (timing, RSSI, MTU); bluezoo models only the API.
    var modelsRadio: Bool { self != .bluezoo }

    var testDescription: String { rawValue }
}

/// A connected peripheral/central pair on one backend, ready for a test body.
struct RadioPair {
    let peripheral: any PeripheralRadio
    let central: any CentralRadio
    let link: any CentralLink
    let clock: any RadioClock
    let parameters: SimulationParameters
    /// Keeps the cross-process airs and their directory alive.
    let owner: AnyObject?

    /// Stops what the pair started (bluezoo and its bus) and waits for it.
    func close() async {
        if let bluez = owner as? BlueZPair { await bluez.close() }
    }
}

/// Runs `body` with a connected pair on `backend` and closes the pair after it, passed or failed.
func withRadioPair(_ backend: Backend, parameters: SimulationParameters = SimulationParameters(),
                   _ body: (RadioPair) async throws -> Void) async throws {
    let pair = try await makeRadioPair(backend, parameters: parameters)
    do { try await body(pair) } catch {
        await pair.close()
        throw error
    }
    await pair.close()
}

func makeRadioPair(_ backend: Backend, parameters: SimulationParameters = SimulationParameters()) async throws -> RadioPair {
    switch backend {
    case .inProcess:
        let clock = ManualClock()
        let air = SimulatedAir(parameters: parameters, clock: clock, pacing: .instant)
        let peripheral = air.peripheral(boxAddress, at: 0)
        let central = air.central(phoneAddress, at: 1)
        try await peripheral.publish(TestService.definition)
        try await peripheral.advertise(TestService.advertising)
        let link = try await central.connect(to: boxAddress, timeout: .seconds(5))
        return RadioPair(peripheral: peripheral, central: central, link: link, clock: clock, parameters: parameters, owner: air)
    case .crossProcess:
        let world = try CrossProcessWorld(parameters: parameters)
        try await world.start()
        let link = try await world.central.connect(to: boxAddress, timeout: .seconds(5))
        return RadioPair(peripheral: world.peripheral, central: world.central, link: link, clock: MonotonicClock(), parameters: parameters, owner: world)
    case .bluezoo:
        let world = try await BluezooWorld(adapters: [boxAddress, phoneAddress])
        var peripheral: BlueZPeripheral?
        var central: BlueZCentral?
        do {
            let box = try await BlueZPeripheral(adapter: "hci0", bus: world.bus.bus)
            peripheral = box
            let phone = try await BlueZCentral(adapter: "hci1", bus: world.bus.bus)
            central = phone
            try await box.publish(TestService.definition)
            try await box.advertise(TestService.advertising)
            // BlueZ connects only to a device it has discovered.
            for try await r in phone.scan(ScanFilter(serviceUUIDs: [TestService.service])) where r.address == boxAddress { break }
            let link = try await phone.connect(to: boxAddress, timeout: .seconds(10))
            return RadioPair(peripheral: box, central: phone, link: link, clock: MonotonicClock(), parameters: parameters,
                             owner: BlueZPair(world: world, peripheral: box, central: phone))
        } catch {
            central?.close()
            await peripheral?.close()
            world.close()
            throw error
        }
    }
}

/// Closes the BlueZ radios before bluezoo and the bus go.
final class BlueZPair: @unchecked Sendable {
    let world: BluezooWorld
    let peripheral: BlueZPeripheral
    let central: BlueZCentral

    init(world: BluezooWorld, peripheral: BlueZPeripheral, central: BlueZCentral) {
        self.world = world
        self.peripheral = peripheral
        self.central = central
    }

    func close() async {
        central.close()
        // bluezoo and the bus stay until the peripheral has unregistered.
        await peripheral.close()
        world.close()
    }
}


/// Two socket airs sharing a fresh directory: the cross-process radio's sockets and files,
/// inside one test process. (`CrossProcessTests` starts a second process for real.)
final class CrossProcessWorld: @unchecked Sendable {
    let directory: String
    let boxAir: SocketAir
    let phoneAir: SocketAir
    let peripheral: SimulatedPeripheral
    let central: SimulatedCentral

    init(parameters: SimulationParameters) throws {
        directory = try makeTemporaryDirectory()
        boxAir = try SocketAir(directory: directory, parameters: parameters)
        phoneAir = try SocketAir(directory: directory, parameters: parameters)
        peripheral = try boxAir.peripheral(boxAddress, at: 0)
        central = phoneAir.central(phoneAddress, at: 1)
    }

    func start() async throws {
        try await peripheral.publish(TestService.definition)
        try await peripheral.advertise(TestService.advertising)
    }

    deinit {
        boxAir.shutdown()
        phoneAir.shutdown()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

