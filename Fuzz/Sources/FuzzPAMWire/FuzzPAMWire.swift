import BoxkeyPAMWire

/// Input: one frame body from the PAM socket, decoded as a request (what the daemon reads)
/// and as a reply (what the module reads). Property: no crash; what decodes re-encodes to the
/// same frame; the request table never allows an undecodable request.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let body = Array(UnsafeBufferPointer(start: data, count: size))
    let frame = [UInt8(body.count >> 8 & 0xff), UInt8(body.count & 0xff)] + body
    if let request = try? PAMRequest.decode(body) {
        precondition(request.encode() == frame)
        _ = PAMConnectionState.fresh.next(on: request)
    }
    if let reply = try? PAMReply.decode(body) {
        precondition(reply.encode() == frame)
    }
    return 0
}
