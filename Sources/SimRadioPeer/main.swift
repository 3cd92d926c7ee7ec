// A peripheral in its own process, for the cross-process radio tests: publishes a small
// service, advertises, and echoes every write back as a notification prefixed "echo:".
// Usage: SimRadioPeer ADDRESS SERVICE-UUID REQUEST-UUID RESPONSE-UUID (directory from
// $BOXKEY_SIM_DIR). Prints "ready" when advertising; exits on end of standard input.
import BoxkeyRadio
import BoxkeySimRadio
import Foundation
import Glibc

let args = CommandLine.arguments
guard args.count == 5, let address = DeviceAddress(args[1]) else {
    FileHandle.standardError.write("usage: SimRadioPeer ADDRESS SERVICE REQUEST RESPONSE\n".data(using: .utf8)!)
    exit(2)
}
let (service, request, response) = (args[2], args[3], args[4])
let air = try SocketAir()
let peripheral = try air.peripheral(address, at: 0)
try await peripheral.publish(GATTService(uuid: service, characteristics: [
    GATTCharacteristic(uuid: request, properties: [.write, .writeWithoutResponse]),
    GATTCharacteristic(uuid: response, properties: .notify),
]))
try await peripheral.advertise(AdvertisingData(serviceUUIDs: [service], manufacturerData: [0xFFFF: [1, 2, 3, 4, 5, 6]]))
FileHandle.standardOutput.write("ready\n".data(using: .utf8)!)

await withTaskGroup(of: Void.self) { group in
    group.addTask {
        for await event in peripheral.events {
            if case .wrote(let central, _, let value, _) = event {
                try? await peripheral.notify(central, characteristic: response, value: Array("echo:".utf8) + value)
            }
        }
    }
    group.addTask {
        // Parent closes our stdin to stop us.
        while FileHandle.standardInput.availableData.count > 0 {}
    }
    await group.next()
    group.cancelAll()
}
air.shutdown()
