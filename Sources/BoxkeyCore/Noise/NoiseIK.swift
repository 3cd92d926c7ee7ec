/// The Noise IK handshake (Noise section 7.5), fixed to 25519 / ChaChaPoly / BLAKE2b:
///
///     IK:
///       <- s
///       ...
///       -> e, es, s, ss
///       <- e, ee, se
///
/// The phone is the initiator: it knows the box's static key from pairing. The box is the
/// responder and learns the phone's static key from message 1. Credentials go only in transport
/// messages after message 2, i.e. after the box's fresh ephemeral key is mixed in (`ee`, `se`):
/// message 1 payloads can be replayed and have no forward secrecy (Noise section 7.7), so Boxkey
/// sends message 1 and message 2 with empty payloads.
///
/// Pairing uses IKpsk2 (Noise section 9): the same pattern with `psk` at the end of message 2,
/// the PSK being the CPace key derived from the pairing code (`CPace`). In PSK mode every `e`
/// token also calls MixKey(e) (section 9.2).
public enum NoiseIK {
    public static let protocolName = "Noise_IK_25519_ChaChaPoly_BLAKE2b"
    public static let pskProtocolName = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2b"
    public static let pskLength = 32

    /// Message 1: e (32) + encrypted s (32 + 16) + encrypted empty payload (16).
    public static let message1Length = PublicKey.length + PublicKey.length + ChaChaPoly.tagLength + ChaChaPoly.tagLength
    /// Message 2: e (32) + encrypted empty payload (16).
    public static let message2Length = PublicKey.length + ChaChaPoly.tagLength
    /// Transport overhead per message: the Poly1305 tag.
    public static let transportOverhead = ChaChaPoly.tagLength
    /// Noise section 3: no message may exceed 65535 bytes.
    public static let maxMessageLength = 65535
}

/// The phone's side of IK.
public struct NoiseIKInitiator {
    private var symmetric: SymmetricState
    private let localStatic: KeyPair
    private let localEphemeral: KeyPair
    private let remoteStatic: PublicKey
    private let pskMode: Bool
    private var step = 0

    /// `ephemeral` is only for test vectors; production code lets it be generated. `psk`:
    /// IKpsk2, whose PSK is given to `readMessage2`.
    public init(prologue: [UInt8], localStatic: KeyPair, remoteStatic: PublicKey, ephemeral: KeyPair? = nil, psk: Bool = false) {
        pskMode = psk
        symmetric = SymmetricState(protocolName: psk ? NoiseIK.pskProtocolName : NoiseIK.protocolName)
        symmetric.mixHash(prologue)
        symmetric.mixHash(remoteStatic.bytes)   // pre-message "<- s"
        self.localStatic = localStatic
        self.localEphemeral = ephemeral ?? KeyPair.generate()
        self.remoteStatic = remoteStatic
    }

    /// -> e, es, s, ss
    public mutating func writeMessage1(payload: [UInt8] = []) throws(NoiseError) -> [UInt8] {
        guard step == 0 else { throw .wrongHandshakeStep }
        step = 1
        var out = localEphemeral.publicKey.bytes
        symmetric.mixHash(localEphemeral.publicKey.bytes)
        if pskMode { symmetric.mixKey(SecureBytes(copying: localEphemeral.publicKey.bytes)) }
        symmetric.mixKey(try dh(localEphemeral.privateKey, remoteStatic))                 // es
        out += try localStatic.publicKey.bytes.withBytes { (p) throws(NoiseError) in try symmetric.encryptAndHash(p) }  // s
        symmetric.mixKey(try dh(localStatic.privateKey, remoteStatic))                    // ss
        out += try payload.withBytes { (p) throws(NoiseError) in try symmetric.encryptAndHash(p) }
        return out
    }

    /// <- e, ee, se. Returns the payload and the transport channel.
    public mutating func readMessage2(_ message: [UInt8], psk: SecureBytes? = nil) throws(NoiseError) -> (payload: SecureBytes, channel: NoiseTransport) {
        guard step == 1, pskMode == (psk != nil) else { throw .wrongHandshakeStep }
        guard message.count >= NoiseIK.message2Length else {
            throw .badMessageLength(expected: NoiseIK.message2Length, actual: message.count)
        }
        step = 2
        let remoteEphemeral = try! PublicKey(message[0..<PublicKey.length])
        symmetric.mixHash(remoteEphemeral.bytes)
        if pskMode { symmetric.mixKey(SecureBytes(copying: remoteEphemeral.bytes)) }
        symmetric.mixKey(try dh(localEphemeral.privateKey, remoteEphemeral))              // ee
        symmetric.mixKey(try dh(localStatic.privateKey, remoteEphemeral))                 // se
        if let psk { symmetric.mixKeyAndHash(psk) }                                       // psk
        let payload = try symmetric.decryptAndHash(message[PublicKey.length...])
        let (send, receive) = symmetric.split()
        return (payload, NoiseTransport(send: send, receive: receive, handshakeHash: symmetric.handshakeHash))
    }
}

/// The box's side of IK.
public struct NoiseIKResponder {
    private var symmetric: SymmetricState
    private let localStatic: KeyPair
    private let localEphemeral: KeyPair
    private var remoteEphemeral: PublicKey?
    /// The phone's static key, known after message 1.
    public private(set) var remoteStatic: PublicKey?
    private let pskMode: Bool
    private var step = 0

    /// `psk`: IKpsk2, whose PSK is given to `writeMessage2`.
    public init(prologue: [UInt8], localStatic: KeyPair, ephemeral: KeyPair? = nil, psk: Bool = false) {
        pskMode = psk
        symmetric = SymmetricState(protocolName: psk ? NoiseIK.pskProtocolName : NoiseIK.protocolName)
        symmetric.mixHash(prologue)
        symmetric.mixHash(localStatic.publicKey.bytes)   // pre-message "<- s"
        self.localStatic = localStatic
        self.localEphemeral = ephemeral ?? KeyPair.generate()
    }

    /// The initiator's ephemeral key from message 1, for the replay cache.
    public var initiatorEphemeral: PublicKey? { remoteEphemeral }

    /// -> e, es, s, ss. Fails on a wrong box key, a different prologue, or tampering.
    public mutating func readMessage1(_ message: [UInt8]) throws(NoiseError) -> SecureBytes {
        guard step == 0 else { throw .wrongHandshakeStep }
        let minimum = PublicKey.length + PublicKey.length + 2 * ChaChaPoly.tagLength
        guard message.count >= minimum else { throw .badMessageLength(expected: minimum, actual: message.count) }
        step = 1
        let re = try! PublicKey(message[0..<32])
        remoteEphemeral = re
        symmetric.mixHash(re.bytes)
        if pskMode { symmetric.mixKey(SecureBytes(copying: re.bytes)) }
        symmetric.mixKey(try dh(localStatic.privateKey, re))                              // es
        let rsBytes = try symmetric.decryptAndHash(message[32..<80])                       // s
        let rs: PublicKey
        do { rs = try PublicKey(rsBytes.unprotectedCopy) } catch { throw .decryptFailed }
        remoteStatic = rs
        symmetric.mixKey(try dh(localStatic.privateKey, rs))                              // ss
        return try symmetric.decryptAndHash(message[80...])
    }

    /// <- e, ee, se
    public mutating func writeMessage2(payload: [UInt8] = [], psk: SecureBytes? = nil) throws(NoiseError) -> (message: [UInt8], channel: NoiseTransport) {
        guard step == 1, let re = remoteEphemeral, let rs = remoteStatic, pskMode == (psk != nil) else { throw .wrongHandshakeStep }
        step = 2
        var out = localEphemeral.publicKey.bytes
        symmetric.mixHash(localEphemeral.publicKey.bytes)
        if pskMode { symmetric.mixKey(SecureBytes(copying: localEphemeral.publicKey.bytes)) }
        symmetric.mixKey(try dh(localEphemeral.privateKey, re))                           // ee
        symmetric.mixKey(try dh(localEphemeral.privateKey, rs))                           // se
        if let psk { symmetric.mixKeyAndHash(psk) }                                       // psk
        out += try payload.withBytes { (p) throws(NoiseError) in try symmetric.encryptAndHash(p) }
        let (initiatorToResponder, responderToInitiator) = symmetric.split()
        return (out, NoiseTransport(send: responderToInitiator, receive: initiatorToResponder, handshakeHash: symmetric.handshakeHash))
    }
}

private func dh(_ privateKey: SecureBytes, _ publicKey: PublicKey) throws(NoiseError) -> SecureBytes {
    do { return try X25519.sharedSecret(privateKey, publicKey) } catch { throw .weakKey }
}
