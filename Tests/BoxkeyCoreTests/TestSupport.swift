import Foundation
@testable import BoxkeyCore

/// Fixed keys so that tests and vectors are reproducible. Never used outside tests.
enum Fixtures {
    static func keyPair(_ seed: UInt8) -> KeyPair {
        try! KeyPair(privateKey: SecureBytes(copying: [UInt8](repeating: seed, count: 32)))
    }
    static let box = keyPair(0x11)
    static let phone = keyPair(0x22)
    static let boxID = BoxID(4821)!
    static let nonce: UInt16 = 0xBEEF

    static var advertisement: Advertisement {
        Advertisement(boxID: boxID, nonce: nonce, keyHint: box.publicKey.advertisementHint)
    }

    static func push(user: String = "alice", password: String = "correct horse", device: String = "pixel") -> CredentialPush {
        CredentialPush(user: user, password: SecureBytes(utf8: password), deviceName: device)
    }
}

/// The package root, found from this file's path.
let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// The Python that has `noiseprotocol` installed: `$BOXKEY_PYTHON`, else `.venv/bin/python3`
/// (created by `scripts/test`).
func interopPython() -> String? {
    if let p = ProcessInfo.processInfo.environment["BOXKEY_PYTHON"], !p.isEmpty { return p }
    let venv = packageRoot.appendingPathComponent(".venv/bin/python3").path
    return FileManager.default.isExecutableFile(atPath: venv) ? venv : nil
}

/// A child process spoken to one line at a time.
final class LinePeer {
    let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private var buffer = Data()

    init(_ executable: String, _ arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardInput = input
        process.standardOutput = output
        try process.run()
    }

    func send(_ line: String) {
        input.fileHandleForWriting.write((line + "\n").data(using: .utf8)!)
    }

    func readLine() -> String {
        while true {
            if let nl = buffer.firstIndex(of: 0x0a) {
                let line = String(data: buffer[buffer.startIndex..<nl], encoding: .utf8)!
                buffer = Data(buffer[(nl + 1)...])
                return line
            }
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { return String(data: buffer, encoding: .utf8) ?? "" }
            buffer.append(chunk)
        }
    }

    func finish() -> Int32 {
        try? input.fileHandleForWriting.close()
        process.waitUntilExit()
        return process.terminationStatus
    }
}

/// Runs a box and a phone connection against each other in memory, with the box's policy
/// hooks as parameters. Returns the phone's event for each box reply.
struct Exchange {
    var box: BoxConnection
    var phone: PhoneConnection
    var nonces = AdvertisementNonces(current: Fixtures.nonce)
    var cache = HandshakeReplayCache()
    var now: Duration = .zero
    var admit: (PublicKey, BoxConnection.HandshakeKind) -> Refusal.Code? = { _, _ in nil }
    /// The code the box shows (pairing), if any.
    var boxCode: PairingCode?

    init(boxKey: PublicKey = Fixtures.box.publicKey, advertisement: Advertisement = Fixtures.advertisement,
         phoneCode: PairingCode? = nil, boxCode: PairingCode? = nil) {
        box = BoxConnection(identity: Fixtures.box, boxID: Fixtures.boxID, connectedAt: .zero)
        phone = PhoneConnection(identity: Fixtures.phone, boxKey: boxKey, advertisement: advertisement, pairingCode: phoneCode)
        self.boxCode = boxCode
    }

    /// Delivers `envelope` to the box and every reply back to the phone.
    mutating func toBox(_ envelope: [UInt8]) -> (BoxConnection.Output, [Result<PhoneConnection.Event, PhoneConnection.Error>]) {
        let out = box.receive(envelope, nonces: nonces, replayCache: &cache, now: now, pairingCode: boxCode, admit: admit)
        return (out, deliver(out.replies))
    }

    mutating func deliver(_ replies: [[UInt8]]) -> [Result<PhoneConnection.Event, PhoneConnection.Error>] {
        replies.map { reply in Result { () throws(PhoneConnection.Error) in try phone.receive(reply) } }
    }

    /// Handshake through to `.ready`; returns message 1 for replay tests.
    @discardableResult
    mutating func open() throws -> [UInt8] {
        let m1 = try phone.start()
        let (_, events) = toBox(m1)
        guard events.count == 1, case .success(.channelOpen) = events[0] else {
            throw TestFailure("handshake did not open: \(events)")
        }
        return m1
    }
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}
