import BoxkeyCore
@testable import BoxkeyPhone
import BoxkeyRadio
import BoxkeySimRadio
import Foundation
import NIOConcurrencyHelpers
import Testing

/// The agent's own time, on a `ManualClock`: how long it holds the credentials and how long
/// after the PIN it may offer a proximity login. No radio is used here.
@Suite(.timeLimit(.minutes(1))) struct AgentTests {
    /// A phone on an empty simulated air: these tests never scan or connect.
    final class QuietRadio: PhoneRadio {
        let air = SimulatedAir()
        var central: any CentralRadio { air.central(DeviceAddress("00:50:48:00:00:01")!) }
        func centralForReattach() -> any CentralRadio { central }
        var canWalk: Bool { false }
        func followMoves(log: (String) -> Void) {}
        func shutdown() {}
    }

    /// A phone whose vault holds alice's password under PIN 246810.
    func phone() throws -> Phone {
        let home = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-agent-\(UUID().uuidString.prefix(8))").path
        let dirs = PhoneDirectories(environment: ["HOME": home])
        let phone = Phone(dirs: dirs, identity: try PhoneIdentity.loadOrCreate(dirs), boxes: try PairedBoxes.load(dirs))
        var vault = try phone.vault()
        try vault.store(user: "alice", password: SecureBytes(utf8: "correct horse"), pin: SecureBytes(utf8: "246810"))
        return phone
    }

    @Test func theCredentialsAreHeldForTheirLifetimeThenDropped() async throws {
        let clock = ManualClock(now: .seconds(1000))
        let told = NIOLockedValueBox<[Bool]>([])
        var proximity = Agent.Proximity()
        proximity.window = .seconds(30)
        let agent = Agent(phone: try phone(), radio: QuietRadio(), lifetime: .seconds(60), proximity: proximity, clock: clock, log: { _ in })
        await agent.onHoldingChanged { held in told.withLockedValue { $0.append(held) } }
        try await agent.unlock(pin: SecureBytes(utf8: "246810"))
        var status = await agent.status()
        #expect(status.credentialsHeld && status.user == "alice" && status.expiresInSeconds == 60 && status.proximityOpen == true)
        // 30 s on: still held, but the proximity window (30 s here) has closed.
        clock.advance(by: .seconds(30))
        await agent.tick()
        status = await agent.status()
        #expect(status.credentialsHeld && status.expiresInSeconds == 30 && status.proximityOpen == false)
        clock.advance(by: .seconds(29))
        await agent.tick()
        #expect(await agent.status().credentialsHeld)
        // The lifetime is over: gone, and the sleep inhibitor is told.
        clock.advance(by: .seconds(1))
        await agent.tick()
        status = await agent.status()
        #expect(!status.credentialsHeld && status.user == nil)
        #expect(told.withLockedValue { $0 } == [false, true, false])
    }

    @Test func aWrongPINHoldsNothingAndForgetDropsAtOnce() async throws {
        let agent = Agent(phone: try phone(), radio: QuietRadio(), lifetime: .seconds(60), clock: ManualClock(), log: { _ in })
        do {
            try await agent.unlock(pin: SecureBytes(utf8: "135790"))
            Issue.record("a wrong PIN opened the vault")
        } catch {
            #expect(error.outcome == .wrongPIN, "\(error)")
        }
        #expect(await !agent.status().credentialsHeld)
        try await agent.unlock(pin: SecureBytes(utf8: "246810"))
        await agent.forget("boxkey lock")
        #expect(await !agent.status().credentialsHeld)
    }
}
