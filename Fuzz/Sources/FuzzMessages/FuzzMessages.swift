import BoxkeyCore

/// Input: any bytes, given to every plaintext decoder. Property: no crash, and whatever decodes
/// re-encodes to the same bytes (decoders are exact, so there is one encoding per value).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let m = try? AppMessage.decode(SecureBytes(copying: bytes)) {
        precondition(m.encode().unprotectedCopy == bytes)
    }
    if let e = try? Envelope.decode(bytes), case .refusal = e {} else if let e = try? Envelope.decode(bytes) {
        precondition(e.encode() == bytes)
    }
    if let a = try? Advertisement.decode(bytes) { precondition(a.encode() == bytes) }
    if let i = try? BoxInfo.decode(bytes) { precondition(i.encode() == bytes) }
    if let c = try? BoxCertificate.decode(bytes) { precondition(c.encode() == bytes) }
    if let l = try? BoxRevocationList.decode(bytes) { precondition(l.encode() == bytes) }
    return 0
}
