import BoxkeyDaemon

/// Input: any text as /etc/boxkey/boxkeyd.conf. Property: the parser returns a config or a
/// clear error, never crashes; what it accepts passes its own range checks.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    if let config = try? DaemonConfig.parse(text) {
        precondition(config.maxConnections >= 1 && config.rssiReturnThreshold > config.rssiLockThreshold)
    }
    return 0
}
