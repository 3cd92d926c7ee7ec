import BoxkeyCore
@testable import BoxkeyDaemon
import Foundation
import Testing

/// `boxkeyd doctor`'s checks that decide from what they are given (here: what the radio heard).
@Suite struct DoctorTests {
    func box(_ id: String) throws -> (DaemonConfig, BoxIdentity) {
        var config = DaemonConfig()
        config.stateDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-doctor-\(UUID().uuidString.prefix(8))").path
        let identity = try BoxIdentity.loadOrCreate(directory: config.stateDirectory, configuredID: BoxID(id)!)
        return (config, identity)
    }

    /// Another box with this box's ID and another key, heard nearby: a warning that says what to
    /// do. The box's own advertisement, and other IDs, are not.
    @Test func anotherBoxWithThisBoxsIDIsAWarning() throws {
        let (config, identity) = try box("4821")
        let own = identity.keyPair.publicKey.advertisementHint
        let mine = Advertisement(boxID: identity.boxID, nonce: 1, keyHint: own)
        let neighbour = Advertisement(boxID: BoxID("4822")!, nonce: 2, keyHint: own &+ 1)
        let twin = Advertisement(boxID: identity.boxID, nonce: 3, keyHint: own &+ 7)
        let quiet = BoxDoctor.boxID(config, heard: [mine, neighbour]).findings
        #expect(quiet.map(\.level) == [.ok])
        #expect(quiet.first?.detail == "4821: no other box nearby advertises it (heard 1 other box(es) in 3 s)")
        let clash = BoxDoctor.boxID(config, heard: [mine, neighbour, twin]).findings
        #expect(clash.map(\.level) == [.warning])
        #expect(clash.first?.detail.contains("another box nearby advertises box ID 4821 (key hint \(String(format: "%02X", own &+ 7))") == true)
        #expect(clash.first?.advice?.contains("[box] id") == true)
    }
}
