import BoxkeyCore
@testable import BoxkeyPhone
import BoxkeyRadio
import BoxkeySimRadio
import Foundation
import Testing

@Suite struct AgentWireTests {
    func decodeRequest(_ frame: SecureBytes) throws -> AgentRequest {
        try frame.withUnsafeBytes { b in
            let length = Int(b[0]) << 8 | Int(b[1])
            #expect(length == b.count - 2)
            return try AgentRequest.decode(UnsafeRawBufferPointer(rebasing: b[2...]))
        }
    }

    @Test func requestsRoundTrip() throws {
        guard case .login(let box, let stay) = try decodeRequest(AgentRequest.login(box: BoxID(4821), stay: true).frame()) else { Issue.record(); return }
        #expect(box == BoxID(4821) && stay)
        guard case .login(nil, false) = try decodeRequest(AgentRequest.login(box: nil, stay: false).frame()) else { Issue.record(); return }
        guard case .act(.lock, BoxID(7)?) = try decodeRequest(AgentRequest.act(.lock, box: BoxID(7)).frame()) else { Issue.record(); return }
        guard case .unlock(let pin) = try decodeRequest(AgentRequest.unlock(pin: SecureBytes(utf8: "246810")).frame()) else { Issue.record(); return }
        #expect(pin.isEqual(to: SecureBytes(utf8: "246810")))
    }

    @Test func repliesRoundTrip() throws {
        for reply in [AgentReply.progress("looking for box 4821… 3 s"), .needPIN, .result(.vaultLockedOut, message: "wait", details: "{}")] {
            let frame = reply.frame()
            #expect(try frame.dropFirst(2).withUnsafeBytes { try AgentReply.decode($0) } == reply)
        }
    }

    /// Exact-length decoders: anything short, long, unknown or out of range is refused.
    @Test(arguments: [
        [UInt8](), [0x00], [0x03, 0x12], [0x03, 0x12, 0xd5, 0x01, 0x00], [0x03, 0x27, 0x10, 0x01],
        [0x04, 0x03, 0xff, 0xff], [0x02, 0x00, 0x05, 0x31], [0x7f],
    ])
    func malformedRequestsAreRefused(_ body: [UInt8]) {
        #expect(throws: AgentWire.DecodeError.self) { try body.withUnsafeBytes { try AgentRequest.decode($0) } }
    }

    @Test func outcomeIsTheExitCodeAndFitsAByte() {
        #expect(Set(Outcome.allCases.map(\.rawValue)).count == Outcome.allCases.count)
        #expect(Outcome.allCases.allSatisfy { $0.rawValue >= 0 && $0.rawValue < 128 })
    }
}

@Suite struct VaultTests {
    func phone() throws -> (PhoneDirectories, PhoneIdentity) {
        let home = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-phone-\(UUID().uuidString.prefix(8))").path
        let dirs = PhoneDirectories(environment: ["HOME": home])
        return (dirs, try PhoneIdentity.loadOrCreate(dirs))
    }

    @Test func newPINsHaveAtLeastSixDigits() {
        #expect(Vault.problem(withNewPIN: SecureBytes(utf8: "2468")) != nil)
        #expect(Vault.problem(withNewPIN: SecureBytes(utf8: "abcdef")) != nil)
        #expect(Vault.problem(withNewPIN: SecureBytes(utf8: "246810")) == nil)
    }

    /// The count is on disk before the PIN is tried: a second vault value loaded while the
    /// first attempt is over sees it, and the right PIN resets it.
    @Test func attemptsAreCountedOnDiskAndResetByTheRightPIN() throws {
        let (dirs, identity) = try phone()
        var vault = try Vault.load(dirs, identity: identity)
        try vault.store(user: "alice", password: SecureBytes(utf8: "pw"), pin: SecureBytes(utf8: "246810"))
        #expect(throws: Vault.Failure.wrongPIN(remaining: 9)) { try vault.credentials(pin: SecureBytes(utf8: "111111"), now: Date()) }
        #expect(try Vault.load(dirs, identity: identity).failures == 1)
        #expect(throws: Vault.Failure.noPINEntered) { try vault.credentials(pin: SecureBytes(count: 0), now: Date()) }
        #expect(try Vault.load(dirs, identity: identity).failures == 1)
        var other = try Vault.load(dirs, identity: identity)
        #expect(try other.credentials(pin: SecureBytes(utf8: "246810"), now: Date()).user == "alice")
        #expect(try Vault.load(dirs, identity: identity).failures == 0)
        #expect(Vault.state(dirs, identity: identity) == .stored(pin: true, failures: 0))
    }

    @Test func aTamperedVaultIsUnusableAndCanBeRemoved() throws {
        let (dirs, identity) = try phone()
        var vault = try Vault.load(dirs, identity: identity)
        try vault.store(user: "alice", password: SecureBytes(utf8: "pw"), pin: nil)
        try Data("{}".utf8).write(to: URL(fileURLWithPath: dirs.vault))
        guard case .unusable = Vault.state(dirs, identity: identity) else { Issue.record("not unusable"); return }
        try Vault.remove(dirs)
        #expect(Vault.state(dirs, identity: identity) == .empty)
    }
}

@Suite struct BoxFinderTests {
    /// Two boxes answer to one ID (no key pinned yet): the nearer, stronger one is taken, not
    /// the first heard.
    @Test func theStrongestOfSeveralMatchingBoxesWins() async throws {
        let air = SimulatedAir(clock: MonotonicClock(), pacing: .realTime)
        let far = air.peripheral(DeviceAddress("00:B0:C5:00:00:01")!, at: 20)
        let near = air.peripheral(DeviceAddress("00:B0:C5:00:00:02")!, at: 0.5)
        for (p, hint) in [(far, UInt8(1)), (near, UInt8(2))] {
            let advert = Advertisement(boxID: BoxID(4821)!, nonce: 7, keyHint: hint)
            try await p.advertise(AdvertisingData(serviceUUIDs: [BoxkeyProtocol.serviceUUID],
                                                  manufacturerData: [BoxkeyProtocol.companyID: advert.encode()]))
        }
        let heard = try await BoxFinder(radio: air.central(DeviceAddress("00:50:48:00:00:01")!, at: 0)).find(BoxID(4821)!, pinned: nil, timeout: .seconds(3))
        #expect(heard?.address == DeviceAddress("00:B0:C5:00:00:02")!)
    }
}
