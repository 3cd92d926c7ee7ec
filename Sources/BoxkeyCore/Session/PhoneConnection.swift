/// The phone's side of one connection to a box, as a pure value.
public struct PhoneConnection {
    public enum Error: Swift.Error, Equatable, Sendable {
        /// The box refused before a channel existed.
        case refused(Refusal)
        /// Message 2 did not decrypt: the box does not hold the pinned key (or a relay tampered).
        case boxAuthenticationFailed
        /// A pairing message 2 did not decrypt: the code was wrong, or this is not the box that
        /// shows it (a box with the same ID and another key). Nothing was pinned or sent.
        case pairingFailed
        case malformed(String)
        /// The box sent something not legal in our state, or we tried to.
        case unexpected(String)
        /// A sealed message failed to decrypt: replay, tampering or loss of sync.
        case channelBroken
        /// The box ended the channel with an error.
        case boxError(ChannelError)
        case closed
    }

    public enum Event: Equatable, Sendable {
        case channelOpen
        case loginResult(LoginResult)
        case actionResult(ActionResult)
        case keepalive
        /// The person asked at the box: push now.
        case intent
        /// The push waits at the box's prompt for Enter there.
        case awaitingEnter(EnterWait)
    }

    public private(set) var state: PhoneSessionState = .idle
    public let advertisement: Advertisement
    public let boxKey: PublicKey

    private var initiator: NoiseIKInitiator
    private var transport: NoiseTransport?
    /// Pairing only: the CPace party and its context.
    private let pairing: (party: CPace.Party, context: [UInt8])?

    /// `advertisement` is the one just heard from the box: its nonce goes into the prologue.
    /// With `pairingCode`, this is a pairing handshake (IKpsk2 keyed by CPace on the code);
    /// `boxKey` is then the key the box's Info claims, which the code verifies.
    public init(identity: KeyPair, boxKey: PublicKey, advertisement: Advertisement, pairingCode: PairingCode? = nil,
                ephemeral: KeyPair? = nil) {
        self.advertisement = advertisement
        self.boxKey = boxKey
        self.initiator = NoiseIKInitiator(prologue: advertisement.prologue, localStatic: identity,
                                          remoteStatic: boxKey, ephemeral: ephemeral, psk: pairingCode != nil)
        pairing = pairingCode.map { code in
            let context = PairingContext.bytes(advertisement: advertisement, boxKey: boxKey, phoneKey: identity.publicKey)
            return (CPace.start(code: code.bytes, context: context), context)
        }
    }

    /// The first envelope to send.
    public mutating func start() throws(Error) -> [UInt8] {
        guard state == .idle else { throw .unexpected("handshake already started") }
        do {
            let message1 = try initiator.writeMessage1()
            state = .awaitingHandshakeResponse
            if let pairing {
                return Envelope.pairingInit(advertisementNonce: advertisement.nonce, share: pairing.party.share, noise: message1).encode()
            }
            return Envelope.handshakeInit(advertisementNonce: advertisement.nonce, noise: message1).encode()
        } catch {
            state = .closed
            throw .malformed("\(error)")
        }
    }

    /// Seals a command; the state must allow it.
    public mutating func send(_ message: AppMessage) throws(Error) -> [UInt8] {
        guard let next = state.next(onSend: message.type) else { throw .unexpected("cannot send \(message.type) while \(state)") }
        if case .credentialPush(let push) = message {
            do { try push.validate() } catch { throw .malformed("\(error)") }
        }
        guard var channel = transport else { throw .closed }
        do {
            let ciphertext = try channel.seal(message.encode())
            transport = channel
            state = next
            return Envelope.sealed(ciphertext).encode()
        } catch {
            close()
            throw .channelBroken
        }
    }

    /// Seals any message, ignoring the state table: a misbehaving phone, for adversarial tests.
    mutating func sealIgnoringState(_ message: AppMessage) throws -> [UInt8] {
        guard var channel = transport else { throw Error.closed }
        let ciphertext = try channel.seal(message.encode())
        transport = channel
        return Envelope.sealed(ciphertext).encode()
    }

    /// Seals arbitrary plaintext bytes as an application message: a phone speaking a message
    /// type this version does not know, for adversarial tests.
    mutating func sealRawForTest(_ plaintext: [UInt8]) throws -> [UInt8] {
        guard var channel = transport else { throw Error.closed }
        let ciphertext = try channel.seal(SecureBytes(copying: plaintext))
        transport = channel
        return Envelope.sealed(ciphertext).encode()
    }

    /// Handles one complete envelope from the box.
    public mutating func receive(_ bytes: [UInt8]) throws(Error) -> Event {
        guard state != .closed else { throw .closed }
        let envelope: Envelope
        do { envelope = try Envelope.decode(bytes) } catch {
            close()
            throw .malformed("\(error)")
        }
        switch (state, envelope) {
        case (_, .refusal(let refusal)):
            close()
            throw .refused(refusal)
        case (.awaitingHandshakeResponse, .pairingResponse(let share, let noise)):
            guard let pairing else { close(); throw .unexpected("pairing response to a login handshake") }
            let psk = try? CPace.finish(pairing.party, peerShare: share, context: pairing.context,
                                        initiatorShare: pairing.party.share, responderShare: share)
            guard let psk else { close(); throw .pairingFailed }
            return try openChannel(noise, psk: psk, failure: .pairingFailed)
        case (.awaitingHandshakeResponse, .handshakeResponse(let noise)):
            guard pairing == nil else { close(); throw .unexpected("login response to a pairing handshake") }
            return try openChannel(noise, psk: nil, failure: .boxAuthenticationFailed)
        case (.idle, _), (.awaitingHandshakeResponse, _):
            close()
            throw .unexpected("expected handshake response")
        case (_, .sealed(let ciphertext)):
            guard var channel = transport else { throw .closed }
            let plaintext: SecureBytes
            do { plaintext = try channel.open(ciphertext) } catch {
                close()
                throw .channelBroken
            }
            transport = channel
            let message: AppMessage
            do { message = try AppMessage.decode(plaintext) } catch {
                close()
                throw .malformed("\(error)")
            }
            guard let next = state.next(onBox: message) else {
                close()
                throw .unexpected("box sent \(message.type) while \(state)")
            }
            state = next
            switch message {
            case .loginResult(let r): return .loginResult(r)
            case .actionResult(let r): return .actionResult(r)
            case .keepalive: return .keepalive
            case .intent: return .intent
            case .awaitingEnter(let w): return .awaitingEnter(w)
            case .error(let e): close(); throw .boxError(e)
            default: close(); throw .unexpected("box sent \(message.type)")
            }
        default:
            close()
            throw .unexpected("envelope not legal while \(state)")
        }
    }

    /// Reads message 2 and opens the channel. A message 2 that does not decrypt is `failure`:
    /// the box does not hold the pinned key, or (pairing) did not use this code.
    private mutating func openChannel(_ noise: [UInt8], psk: SecureBytes?, failure: Error) throws(Error) -> Event {
        do {
            let (payload, channel) = try initiator.readMessage2(noise, psk: psk)
            guard payload.count == 0 else { close(); throw Error.malformed("message 2 payload must be empty") }
            transport = channel
            state = .ready
            return .channelOpen
        } catch let error as Error {
            throw error
        } catch {
            close()
            throw failure
        }
    }

    public mutating func close() {
        state = .closed
        transport = nil
    }
}
