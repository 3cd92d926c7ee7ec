import BoxkeyTestWorlds
import BoxkeyRadio
import BoxkeySimRadio
import Foundation
import Testing

/// The cross-process radio with a real second process: the peripheral runs in `SimRadioPeer`.
@Suite(.serialized) struct CrossProcessTests {
    static let peer = DeviceAddress("00:AA:01:00:00:07")!

    /// Starts the peer and waits for "ready".
    func startPeer(directory: String) throws -> (Process, Pipe) {
        let binary = productsDirectory.appendingPathComponent("SimRadioPeer").path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = [Self.peer.string, TestService.service, TestService.request, TestService.response]
        var environment = ProcessInfo.processInfo.environment
        environment["BOXKEY_SIM_DIR"] = directory
        process.environment = environment
        let input = Pipe(), output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        let line = String(data: output.fileHandleForReading.availableData, encoding: .utf8) ?? ""
        guard line.contains("ready") else {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw RadioError.unavailable("peer did not start: \(line)")
        }
        return (process, input)
    }

    @Test func twoProcessesExchangeData() async throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (process, stdin) = try startPeer(directory: directory)
        defer { try? stdin.fileHandleForWriting.close(); process.waitUntilExit() }

        let air = try SocketAir(directory: directory)
        defer { air.shutdown() }
        let central = air.central(phoneAddress)
        var found: ScanResult?
        for try await result in central.scan(ScanFilter(serviceUUIDs: [TestService.service])) { found = result; break }
        #expect(found?.address == Self.peer)
        #expect(found?.advertisement.manufacturerData[0xFFFF] == [1, 2, 3, 4, 5, 6])

        let link = try await central.connect(to: Self.peer, timeout: .seconds(5))
        try await link.subscribe(TestService.response)
        try await link.write(TestService.request, value: Array("hello".utf8), withResponse: true)
        var events = link.events.makeAsyncIterator()
        #expect(await events.next() == .notification(characteristic: TestService.response, value: Array("echo:hello".utf8)))
        await link.disconnect()
    }

    @Test func peerThatDiesIsLostAfterTheSupervisionTimeout() async throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (process, _) = try startPeer(directory: directory)
        // Killed below; here too when the test fails before that.
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) }; process.waitUntilExit() }
        let air = try SocketAir(directory: directory)
        defer { air.shutdown() }
        let link = try await air.central(phoneAddress).connect(to: Self.peer, timeout: .seconds(5))
        let clock = MonotonicClock()
        kill(process.processIdentifier, SIGKILL)
        let killedAt = clock.now
        var events = link.events.makeAsyncIterator()
        #expect(await events.next() == .disconnected(.supervisionTimeout))
        let noticed = clock.now - killedAt
        #expect(noticed >= .milliseconds(400) && noticed < .milliseconds(1500), "noticed after \(noticed)")
    }
}

/// Where SwiftPM put the built executables (next to the test bundle).
let productsDirectory: URL = {
    URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
}()
