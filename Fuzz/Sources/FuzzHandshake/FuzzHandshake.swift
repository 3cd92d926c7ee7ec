import BoxkeyCore

let box = try! KeyPair(privateKey: SecureBytes(copying: [UInt8](repeating: 0x11, count: 32)))
let boxID = BoxID(4821)!
/// A live code, so pairing envelopes reach the CPace and IKpsk2 paths too.
let code = PairingCode("123456")!

/// Input: a sequence of envelopes (each preceded by a 2-byte length) delivered to one box
/// connection. Property: no crash, no request other than close for unauthenticated input, and
/// the connection ends closed or waiting, never in a state it could not reach.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    var connection = BoxConnection(identity: box, boxID: boxID, connectedAt: .zero)
    var cache = HandshakeReplayCache()
    let nonces = AdvertisementNonces(current: 0xBEEF)
    var offset = 0
    while offset + 2 <= bytes.count {
        let length = Int(bytes[offset]) << 8 | Int(bytes[offset + 1])
        offset += 2
        let end = min(offset + length, bytes.count)
        let out = connection.receive(Array(bytes[offset..<end]), nonces: nonces, replayCache: &cache, now: .milliseconds(offset), pairingCode: code, admit: { _, _ in nil })
        offset = end
        if case .login = out.request { preconditionFailure("unauthenticated input produced a login") }
        if case .action = out.request { preconditionFailure("unauthenticated input produced an action") }
    }
    return 0
}
