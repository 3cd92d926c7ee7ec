import BoxkeyPAMWire

/// Input: one frame body, decoded as a PAM socket request (what the daemon reads) and reply
/// (what the module reads), and as an admin socket request and reply. Property: no crash; what decodes re-encodes to the
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
    if let request = try? AdminRequest.decode(body) {
        precondition(request.encode() == frame)
        precondition((try? PAMRequest.decode(body)) == nil)  // no request is both sockets'
    }
    var reader = AdminReply.Reader()
    if let reply = try? reader.read(body) {
        precondition(reply.encode() == frame)
    }
    return 0
}
