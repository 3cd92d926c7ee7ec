import BoxkeyCore

/// Input: a stream of fragments, each preceded by one length byte, fed to one reassembler at
/// MTU 23 + (first byte % 495); the reassembler learns its channel from the first fragment, as
/// the box's does. Property: no crash, and every message that comes out re-fragments
/// and reassembles to itself.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    guard let first = bytes.first else { return 0 }
    let mtu = 23 + Int(first) % 495
    var reassembler = FrameReassembler()
    var offset = 1
    var now: Duration = .zero
    while offset < bytes.count {
        let length = Int(bytes[offset])
        offset += 1
        let end = min(offset + length, bytes.count)
        let fragment = Array(bytes[offset..<end])
        offset = end
        now += .milliseconds(Int(length) * 7)
        if let message = try? reassembler.receive(fragment, mtu: mtu, now: now) {
            precondition(message.count <= Envelope.maxLength)
            var check = FrameReassembler()
            var out: [UInt8]?
            for f in try! Framing.fragment(message, mtu: mtu, channel: reassembler.channel!) { out = try! check.receive(f, mtu: mtu, now: .zero) }
            precondition(out == message)
        }
    }
    return 0
}
