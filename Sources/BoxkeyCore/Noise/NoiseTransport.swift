/// The post-handshake channel: one CipherState per direction (Noise section 5.3 Split).
///
/// BLE's link layer delivers in order and without loss (losses are whole disconnects), so the
/// implicit-nonce transport of Noise section 5.1 applies: a replayed, dropped or reordered
/// message fails to decrypt because the counters no longer agree.
///
/// Rekey: both sides call Noise REKEY on a direction's key after every `rekeyInterval`
/// messages in that direction, so no signalling is needed and a key encrypts a bounded
/// amount of data.
public struct NoiseTransport: Sendable {
    /// Messages per direction between rekeys. A presence link sends a keepalive every few
    /// seconds, so this is reached after hours; it exists so that a long-lived link never
    /// encrypts unbounded data under one key.
    public static let rekeyInterval: UInt64 = 1 << 16

    private var send: CipherState
    private var receive: CipherState
    /// Noise section 11.2 channel binding value.
    public let handshakeHash: [UInt8]

    init(send: CipherState, receive: CipherState, handshakeHash: [UInt8]) {
        self.send = send
        self.receive = receive
        self.handshakeHash = handshakeHash
    }

    public var sendNonce: UInt64 { send.nonce }
    public var receiveNonce: UInt64 { receive.nonce }

    public mutating func seal(_ plaintext: UnsafeRawBufferPointer) throws(NoiseError) -> [UInt8] {
        guard plaintext.count + NoiseIK.transportOverhead <= NoiseIK.maxMessageLength else { throw .messageTooLong }
        let out = try send.encrypt(ad: [], plaintext: plaintext)
        if send.nonce % Self.rekeyInterval == 0 { send.rekey() }
        return out
    }

    public mutating func seal(_ plaintext: SecureBytes) throws(NoiseError) -> [UInt8] {
        try plaintext.withUnsafeBytes { (p) throws(NoiseError) in try seal(p) }
    }

    public mutating func open(_ ciphertext: [UInt8]) throws(NoiseError) -> SecureBytes {
        guard ciphertext.count <= NoiseIK.maxMessageLength else { throw .messageTooLong }
        let out = try ciphertext.withBytes { (c) throws(NoiseError) in try receive.decrypt(ad: [], ciphertext: c) }
        if receive.nonce % Self.rekeyInterval == 0 { receive.rekey() }
        return out
    }

    /// Test hook: jump the counters, to exercise rekey and exhaustion without 2^64 messages.
    mutating func setNonces(send s: UInt64, receive r: UInt64) {
        send.nonce = s
        receive.nonce = r
    }
}
