/// The box's side of one phone connection, as a pure value: envelopes in, envelopes and
/// requests for the daemon out. The daemon owns the I/O, the PAM bridge and logind; this type
/// owns the handshake, the channel and the rules of `BoxSessionState`.
public struct BoxConnection {
    /// Time allowed from connect to a valid message 1.
    public static let defaultHandshakeTimeout: Duration = .seconds(5)
    /// Time allowed from the handshake to the phone's first command.
    public static let defaultCommandTimeout: Duration = .seconds(10)

    /// What the daemon must do after a call.
    public enum Request: Sendable {
        /// Hand the credentials to the PAM stack that is waiting, then call `finishLogin`.
        case login(CredentialPush)
        /// Show the waiting prompt that this phone is near; call `giveIntent` once the person
        /// asks there, or `finishLogin` with a refusal.
        case offer(ProximityOffer)
        /// Lock, log out, or attach to the phone's session, then call `finishAction`.
        case action(ActionResult.Action)
        /// The session is over; disconnect after sending `replies`.
        case close(reason: CloseReason)
        /// A pairing handshake answered under the box's live code: one of the code's tries is used.
        case pairingAttempt(PublicKey)
        /// A sealed keepalive arrived (answered in `replies`): the phone is present.
        case keepalive
        /// The phone takes its push back: drop it if it still waits for Enter (`finishLogin`
        /// with `withdrawn`), else let the verdict answer.
        case withdraw
    }

    /// Which handshake a phone started: a login (enrolled keys only) or a pairing (any key,
    /// proved by the code shown at the box).
    public enum HandshakeKind: Sendable, Equatable { case login, pairing }

    public enum CloseReason: Equatable, Sendable {
        case refused(Refusal.Code)
        case protocolViolation(String)
        case peerError(ChannelError)
        case finished
        /// The phone left on purpose (`detach`): not a walk-away.
        case detached
        case timedOut
    }

    public struct Output: Sendable {
        /// Envelopes to send to the phone, in order.
        public var replies: [[UInt8]] = []
        public var request: Request?
        /// The reply is the handshake's answer again, for message 1 sent again on this link.
        public var repeatedAnswer = false
        /// A message 1 that `admit` refused, for the caller to put in the replay cache when the
        /// key is one nobody can make up (an enrolled phone's): replayed once a slot frees, it
        /// would be taken. Unknown keys are not cached, or made-up ones would fill the cache.
        public var refusedHandshake: (ephemeral: PublicKey, nonce: UInt16)?
    }

    /// How often one link may have its handshake answered again (`receive`).
    public static let maxRepeatedAnswers = 2
    /// Why a link that sent message 1 once too often was closed.
    public static let tooManyRepeats = "message 1 sent too many times"

    public private(set) var state: BoxSessionState = .awaitingHandshake
    /// The phone's static key, once message 1 has been read.
    public private(set) var phoneKey: PublicKey?
    public let handshakeTimeout: Duration
    public let commandTimeout: Duration

    private let identity: KeyPair
    private let boxID: BoxID
    private var transport: NoiseTransport?
    private var deadline: Duration?
    /// Message 1 and the box's answer, until the phone's first sealed message: over BlueZ a
    /// notification sent before the phone's subscription reached the box's bluetoothd is
    /// dropped, and the phone, having heard nothing, sends message 1 again on this link.
    private var answered: (message: [UInt8], answer: [UInt8], repeats: Int)?

    public init(identity: KeyPair, boxID: BoxID, connectedAt now: Duration,
                handshakeTimeout: Duration = defaultHandshakeTimeout,
                commandTimeout: Duration = defaultCommandTimeout) {
        self.identity = identity
        self.boxID = boxID
        self.handshakeTimeout = handshakeTimeout
        self.commandTimeout = commandTimeout
        self.deadline = now + handshakeTimeout
    }

    /// When the daemon should call `tick` next, if the session is waiting on the phone.
    public var nextDeadline: Duration? { deadline }

    /// Handles one complete envelope from the phone.
    ///
    /// - `nonces`: the advertisement nonces the box currently accepts.
    /// - `replayCache`: shared by all connections of the box.
    /// - `pairingCode`: the code the box shows now, if any (a pairing handshake needs it).
    /// - `admit`: asked with the phone's static key once message 1 decrypts; returns a refusal
    ///   code for an unknown (login), revoked or rate-limited phone, nil to go on. It is asked
    ///   before the replay cache, so unknown keys never fill the cache.
    public mutating func receive(_ bytes: [UInt8], nonces: AdvertisementNonces, replayCache: inout HandshakeReplayCache,
                                 now: Duration, pairingCode: PairingCode? = nil,
                                 admit: (PublicKey, HandshakeKind) -> Refusal.Code?) -> Output {
        guard state != .closed else { return Output() }
        if var first = answered, bytes == first.message {
            // The same bytes on the same link: the same answer, which says nothing new (it went
            // to every subscribed phone the first time). No second try of a pairing code, no
            // replay-cache entry. Another link sending these bytes meets the replay cache.
            guard first.repeats < Self.maxRepeatedAnswers else { return fail(.unexpectedMessage, Self.tooManyRepeats) }
            first.repeats += 1
            answered = first
            return Output(replies: [first.answer], repeatedAnswer: true)
        }
        let envelope: Envelope
        do {
            envelope = try Envelope.decode(bytes)
        } catch .unsupportedVersion {
            return refuse(.unsupportedVersion)
        } catch {
            return state == .awaitingHandshake ? refuse(.malformed) : fail(.malformed, "bad envelope: \(error)")
        }

        switch (state, envelope) {
        case (.awaitingHandshake, .handshakeInit(let nonce, let noise)):
            return remember(bytes, handshake(nonce: nonce, message1: noise, pairing: nil, nonces: nonces, replayCache: &replayCache, now: now, admit: admit))
        case (.awaitingHandshake, .pairingInit(let nonce, let share, let noise)):
            guard let pairingCode else { return refuse(.noPairingCode) }
            return remember(bytes, handshake(nonce: nonce, message1: noise, pairing: (pairingCode, share), nonces: nonces,
                                             replayCache: &replayCache, now: now, admit: admit))
        case (.awaitingHandshake, _):
            return refuse(.malformed)
        case (_, .sealed(let ciphertext)):
            return sealed(ciphertext, now: now)
        default:
            return fail(.unexpectedMessage, "envelope kind not legal after the handshake")
        }
    }

    /// The PAM stack's verdict on the push.
    public mutating func finishLogin(_ result: LoginResult) -> Output {
        guard let next = state.next(onLoginResult: result.outcome) else { return Output() }
        var out = Output()
        out.replies = seal(.loginResult(result))
        state = next
        deadline = nil
        if next == .closed { out.request = .close(reason: .finished) }
        return out
    }

    /// The push waits at a prompt for Enter there: the phone hears where, and for how long.
    public mutating func holdLogin(_ wait: EnterWait) -> Output {
        guard state == .verifying else { return Output() }
        var out = Output()
        out.replies = seal(.awaitingEnter(wait))
        return out
    }

    /// The person asked at the box: the offering phone pushes now (within the command timeout).
    public mutating func giveIntent(now: Duration) -> Output {
        guard let next = state.onIntent else { return Output() }
        var out = Output()
        out.replies = seal(.intent)
        state = next
        deadline = now + commandTimeout
        return out
    }

    /// The outcome of a lock, logout or attach.
    public mutating func finishAction(_ result: ActionResult) -> Output {
        guard let next = state.next(onActionResult: result) else { return Output() }
        var out = Output()
        out.replies = seal(.actionResult(result))
        state = next
        deadline = nil
        if next == .closed { out.request = .close(reason: .finished) }
        return out
    }

    /// Enforces the handshake and command timeouts.
    public mutating func tick(now: Duration) -> Output {
        guard let deadline, now >= deadline, state != .closed else { return Output() }
        if state == .awaitingHandshake { return refuse(.timedOut, reason: .timedOut) }
        if state == .awaitingPairConfirm {
            // The phone could not open message 2 (wrong code) and went quiet.
            close()
            return Output(request: .close(reason: .timedOut))
        }
        var out = Output()
        out.replies = seal(.error(ChannelError(.unexpectedMessage, detail: "timed out waiting for a command")))
        close()
        out.request = .close(reason: .timedOut)
        return out
    }

    // MARK: - Steps

    /// Keeps message 1 and its answer while the handshake went through.
    private mutating func remember(_ message: [UInt8], _ out: Output) -> Output {
        if state != .awaitingHandshake, state != .closed, out.replies.count == 1 {
            answered = (message, out.replies[0], 0)
        }
        return out
    }

    private mutating func handshake(nonce: UInt16, message1: [UInt8], pairing: (code: PairingCode, share: [UInt8])?,
                                    nonces: AdvertisementNonces, replayCache: inout HandshakeReplayCache, now: Duration,
                                    admit: (PublicKey, HandshakeKind) -> Refusal.Code?) -> Output {
        guard nonces.accepts(nonce) else { return refuse(.staleAdvertisement) }
        let advertisement = Advertisement(boxID: boxID, nonce: nonce, keyHint: identity.publicKey.advertisementHint)
        var responder = NoiseIKResponder(prologue: advertisement.prologue, localStatic: identity, psk: pairing != nil)
        let payload: SecureBytes
        do {
            payload = try responder.readMessage1(message1)
        } catch {
            return refuse(.handshakeFailed)
        }
        // Boxkey v1 sends message 1 with an empty payload (docs/protocol.md).
        guard payload.count == 0, let phone = responder.remoteStatic, let ephemeral = responder.initiatorEphemeral else {
            return refuse(.malformed)
        }
        phoneKey = phone
        if let code = admit(phone, pairing == nil ? .login : .pairing) {
            var out = refuse(code)
            out.refusedHandshake = (ephemeral, nonce)
            return out
        }
        if replayCache.insert(ephemeral, nonce: nonce, phone: phone) == .replayed { return refuse(.replayedHandshake) }
        guard let pairing else {
            do {
                let (message2, channel) = try responder.writeMessage2()
                transport = channel
                state = .awaitingCommand
                deadline = now + commandTimeout
                return Output(replies: [Envelope.handshakeResponse(noise: message2).encode()])
            } catch {
                return refuse(.handshakeFailed)
            }
        }
        // Pairing: the PSK is the CPace key for the code this box shows. A phone that used
        // another code cannot open message 2, and learns nothing it could test codes against
        // offline; the box learns of a wrong code when the phone's `pair` fails to decrypt.
        let context = PairingContext.bytes(advertisement: advertisement, boxKey: identity.publicKey, phoneKey: phone)
        let party = CPace.start(code: pairing.code.bytes, context: context)
        do {
            let psk = try CPace.finish(party, peerShare: pairing.share, context: context,
                                       initiatorShare: pairing.share, responderShare: party.share)
            let (message2, channel) = try responder.writeMessage2(psk: psk)
            transport = channel
            state = .awaitingPairConfirm
            deadline = now + commandTimeout
            return Output(replies: [Envelope.pairingResponse(share: party.share, noise: message2).encode()],
                          request: .pairingAttempt(phone))
        } catch {
            return refuse(.malformed)
        }
    }

    private mutating func sealed(_ ciphertext: [UInt8], now: Duration) -> Output {
        answered = nil   // the phone has the answer
        guard var channel = transport else { return fail(.unexpectedMessage, "no channel") }
        let plaintext: SecureBytes
        do {
            plaintext = try channel.open(ciphertext)
        } catch {
            // A tampered, replayed or reordered message: the channel cannot be trusted further.
            close()
            return Output(request: .close(reason: .protocolViolation("sealed message failed to decrypt")))
        }
        transport = channel
        let message: AppMessage
        do {
            message = try AppMessage.decode(plaintext)
        } catch {
            return fail(.malformed, "\(error)")
        }
        guard let next = state.next(onPhone: message.type) else {
            return fail(.unexpectedMessage, "\(message.type) not legal while \(state)")
        }
        state = next
        var out = Output()
        switch message {
        case .credentialPush(let push):
            deadline = nil
            out.request = .login(push)
        case .lock: deadline = nil; out.request = .action(.lock)
        case .logout: deadline = nil; out.request = .action(.logout)
        case .attach: deadline = nil; out.request = .action(.attach)
        case .pair: deadline = nil; out.request = .action(.pair)
        case .offer(let offer): deadline = nil; out.request = .offer(offer)
        case .keepalive: out.replies = seal(.keepalive); out.request = .keepalive
        case .withdraw: out.request = .withdraw
        case .error(let e): close(); out.request = .close(reason: .peerError(e))
        case .detach: close(); out.request = .close(reason: .detached)
        case .loginResult, .actionResult, .intent, .awaitingEnter: break   // excluded by the state table
        }
        return out
    }

    private mutating func seal(_ message: AppMessage) -> [[UInt8]] {
        guard var channel = transport else { return [] }
        do {
            let ciphertext = try channel.seal(message.encode())
            transport = channel
            return [Envelope.sealed(ciphertext).encode()]
        } catch {
            close()
            return []
        }
    }

    private mutating func refuse(_ code: Refusal.Code, reason: CloseReason? = nil) -> Output {
        close()
        return Output(replies: [Envelope.refusal(Refusal(code)).encode()], request: .close(reason: reason ?? .refused(code)))
    }

    private mutating func fail(_ code: ChannelError.Code, _ detail: String) -> Output {
        var out = Output()
        out.replies = seal(.error(ChannelError(code, detail: String(detail.prefix(ChannelError.maxDetailLength)))))
        close()
        out.request = .close(reason: .protocolViolation(detail))
        return out
    }

    private mutating func close() {
        state = .closed
        transport = nil
        deadline = nil
        answered = nil
    }
}

/// The CPace context of a pairing handshake: what both sides must agree on besides the code.
public enum PairingContext {
    public static func bytes(advertisement: Advertisement, boxKey: PublicKey, phoneKey: PublicKey) -> [UInt8] {
        Array("BOXKEY-PAIR".utf8) + advertisement.prologue + boxKey.bytes + phoneKey.bytes
    }
}
