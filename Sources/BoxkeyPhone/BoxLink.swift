import BoxkeyCore
import BoxkeyRadio

/// One connection from the phone to a box: GATT plumbing, framing and the Noise channel. An
/// actor: the session state and the reassembler change only on its executor.
public actor BoxLink {
    public enum Failure: Error, CustomStringConvertible, Equatable {
        case radio(String)
        case refused(Refusal)
        case keyChanged
        /// A pairing handshake failed: wrong code, or not the box that shows it.
        case pairingFailed
        case protocolError(String)
        case linkLost(DisconnectReason)
        case timedOut(String)

        public var description: String {
            switch self {
            case .radio(let s): "radio: \(s)"
            case .refused(let r): "the box refused: \(r.code)"
            case .keyChanged: "the box did not prove it holds the pinned key"
            case .pairingFailed: "pairing failed: the code was wrong, or this is not the box that shows it"
            case .protocolError(let s): "protocol error: \(s)"
            case .linkLost(let r): "the link to the box was lost (\(r.sentence))"
            case .timedOut(let s): "timed out \(s)"
            }
        }
    }

    let link: any CentralLink
    private var connection: PhoneConnection
    /// This connection's channel: the box answers on it, and other phones' notifications
    /// (BlueZ sends them to every subscribed central) are passed over.
    private let channel: FrameChannel
    private var reassembler: FrameReassembler
    private let inbox = Inbox<LinkEvent>()
    private let reader: Task<Void, Never>
    private let clock = MonotonicClock()
    private let mtu: Int
    private var closed = false
    /// Why the link went, once it has: every read from then on fails at once with it.
    public private(set) var lostReason: DisconnectReason?
    /// Message 1, kept to be sent again while no answer comes (`awaitChannel`).
    private var firstMessage: [UInt8] = []
    /// The box's answer to it, to pass over when the box answers message 1 sent again.
    private var firstAnswer: [UInt8]?
    /// When a fragment on this link's channel last arrived.
    private var heardAt: Duration?
    public nonisolated var peer: DeviceAddress { link.peer }
    /// The box key the handshake proved.
    public nonisolated let boxKey: PublicKey

    /// Connects, subscribes and runs the handshake: a login handshake to a pinned key, or with
    /// `pairingCode` a pairing handshake that proves the code and verifies `boxKey`.
    public static func open(to box: HeardBox, boxKey: PublicKey, identity: PhoneIdentity, radio: any CentralRadio,
                            pairingCode: PairingCode? = nil, timeout: Duration = .seconds(10),
                            answerWait: Duration = answerWait) async throws -> BoxLink {
        let link: any CentralLink
        do {
            link = try await radio.connect(to: box.address, timeout: timeout)
            try await discoverBoxkeyService(on: link)
        } catch {
            throw Failure.radio("\(error)")
        }
        return try await handshake(on: link, box: box, boxKey: boxKey, identity: identity, pairingCode: pairingCode, timeout: timeout,
                                   answerWait: answerWait)
    }

    /// Pairing over one connection: reads the box's Info (the key it claims, and its ID, which
    /// `check` looks at), then runs the pairing handshake under `code`, which proves that key.
    /// One connection, not one for Info and another for the handshake: a link set up right
    /// after another to the same box ended was sometimes dropped by BlueZ in the lab.
    public static func openForPairing(to box: HeardBox, identity: PhoneIdentity, radio: any CentralRadio, code: PairingCode,
                                      timeout: Duration = .seconds(10),
                                      check: (BoxInfo) throws -> Void) async throws -> (BoxInfo, BoxLink) {
        try await openReadingInfo(to: box, identity: identity, radio: radio, code: code, timeout: timeout, check: check)
    }

    /// Reads the box's Info, lets `check` judge it (a pairing: the ID; a fleet box: its
    /// certificate), then runs the handshake to the key Info claims: the pairing handshake under
    /// `code`, or a login handshake. Either proves the box holds that key.
    public static func openReadingInfo(to box: HeardBox, identity: PhoneIdentity, radio: any CentralRadio, code: PairingCode?,
                                       timeout: Duration = .seconds(10),
                                       check: (BoxInfo) throws -> Void) async throws -> (BoxInfo, BoxLink) {
        let link: any CentralLink
        do {
            link = try await radio.connect(to: box.address, timeout: timeout)
        } catch {
            throw Failure.radio("\(error)")
        }
        let info: BoxInfo
        do {
            try await discoverBoxkeyService(on: link)
            info = try BoxInfo.decode(try await link.read(BoxkeyProtocol.infoCharacteristicUUID))
            try check(info)
        } catch {
            await link.disconnect()
            if let e = error as? BoxInfo.DecodeError { throw Failure.protocolError("bad box info: \(e)") }
            if error is RadioError { throw Failure.radio("\(error)") }
            throw error
        }
        return (info, try await handshake(on: link, box: box, boxKey: info.staticKey, identity: identity, pairingCode: code, timeout: timeout,
                                          answerWait: answerWait))
    }

    /// Subscribes on a connected, discovered link and runs the handshake; the link is closed
    /// when that fails.
    private static func handshake(on link: any CentralLink, box: HeardBox, boxKey: PublicKey, identity: PhoneIdentity,
                                  pairingCode: PairingCode?, timeout: Duration, answerWait: Duration) async throws -> BoxLink {
        let session = BoxLink(link: link, connection: PhoneConnection(identity: identity.keyPair, boxKey: boxKey, advertisement: box.advertisement,
                                                                      pairingCode: pairingCode),
                              mtu: await link.mtu)
        do {
            try await session.start()
            try await session.awaitChannel(timeout: timeout, answerWait: answerWait)
        } catch {
            await session.close()
            throw error
        }
        return session
    }

    /// Discovers the Boxkey service and waits until all three characteristics are there. A
    /// central's GATT cache can show a box's old database for a moment after the box started
    /// again at the same address (seen over BlueZ in the lab: the service without Info),
    /// until the Database Hash check has it discovered afresh.
    static func discoverBoxkeyService(on link: any CentralLink) async throws {
        let needed: Set = [BoxkeyProtocol.infoCharacteristicUUID, BoxkeyProtocol.requestCharacteristicUUID, BoxkeyProtocol.responseCharacteristicUUID]
        for attempt in 0..<10 {
            let service = try await link.discover(service: BoxkeyProtocol.serviceUUID)
            if needed.isSubset(of: Set(service.characteristics.map { $0.uuid.lowercased() })) { return }
            if attempt == 9 { throw RadioError.characteristicNotFound(needed.subtracting(service.characteristics.map { $0.uuid.lowercased() }).sorted().joined(separator: ", ")) }
            try await Task.sleep(for: .milliseconds(300))
        }
    }

    private init(link: any CentralLink, connection: PhoneConnection, mtu: Int) {
        boxKey = connection.boxKey
        self.link = link
        self.connection = connection
        self.mtu = mtu
        channel = FrameChannel.random()
        reassembler = FrameReassembler(channel: channel)
        let inbox = inbox
        let events = link.events
        // Link events are read by this one task for the link's life, so a caller's timeout
        // never cancels the stream itself.
        reader = Task {
            for await e in events { inbox.put(e) }
            inbox.close()
        }
    }

    deinit { reader.cancel() }

    /// After the subscription is confirmed, how long the phone waits for the answer to message 1
    /// before sending it again (`awaitChannel`). A box answers within a few connection events.
    public static let answerWait: Duration = .milliseconds(400)

    /// Enables the box's notifications and sends the handshake's first message, as Write
    /// Commands, without waiting for the subscription's response: they share connection events.
    /// The message may reach the box before the subscription does. The box then holds its
    /// answer until it learns of the subscription; over BlueZ, whose GATT server tells a box of
    /// a characteristic's first subscriber only, a box with another phone subscribed may answer
    /// too soon, and the answer is dropped. `awaitChannel` sends message 1 again for that.
    private func start() async throws {
        let first: [UInt8]
        do { first = try connection.start() } catch { throw Failure.protocolError("\(error)") }
        firstMessage = first
        do {
            let fragments = try Framing.fragment(first, mtu: mtu, channel: channel)
            try await link.subscribe(BoxkeyProtocol.responseCharacteristicUUID, thenWrite: BoxkeyProtocol.requestCharacteristicUUID, fragments: fragments)
        } catch let e as RadioError {
            if case .disconnected(let r) = e { throw Failure.linkLost(r) }
            throw Failure.radio("\(e)")
        }
    }

    /// Waits for the box's answer to message 1. If none has come `answerWait` after the
    /// subscription was confirmed, message 1 goes again on this link, the same bytes, which the
    /// box answers again (up to `BoxConnection.maxRepeatedAnswers` times); an answer that comes
    /// twice is taken once.
    private func awaitChannel(timeout: Duration, answerWait: Duration) async throws {
        let deadline = clock.now + timeout
        var resent = 0
        var wait = answerWait
        while true {
            let mayResend = resent < BoxConnection.maxRepeatedAnswers
            do {
                guard try await next(timeout: mayResend ? min(wait, deadline - clock.now) : deadline - clock.now) == .channelOpen else {
                    throw Failure.protocolError("no channel")
                }
                return
            } catch Failure.timedOut(let what) {
                guard mayResend, clock.now < deadline, !Task.isCancelled else { throw Failure.timedOut(what) }
                // An answer whose first fragment is in, or whose fragments are still arriving,
                // is on its way: sent again now, its rest and the repeat's would interleave.
                if reassembler.hasFirstFragment || heardAt.map({ clock.now - $0 < answerWait / 2 }) == true {
                    wait = max(answerWait, .milliseconds(5))
                    continue
                }
                wait = answerWait
                resent += 1
                // The rest of an answer whose first fragment was dropped (sent just before the
                // subscription took) would collide with the repeated answer's fragments.
                reassembler.reset()
                // As Write Commands, like the first time: a request a box never answers would
                // hold the phone past the deadline (a D-Bus call's 25 s over BlueZ). The answer
                // is what says it arrived.
                try await write(firstMessage, confirmed: false)
            }
        }
    }

    public func send(_ message: AppMessage) async throws {
        let envelope: [UInt8]
        do { envelope = try connection.send(message) } catch { throw Failure.protocolError("\(error)") }
        try await write(envelope)
    }

    /// The next event from the box, or a failure (refusal, key mismatch, link loss, timeout).
    public func next(timeout: Duration) async throws -> PhoneConnection.Event {
        let deadline = clock.now + timeout
        // A link that is gone or closed has nothing more to say: at once, not after `timeout`
        // (a caller looping on reads would spin on an instant "timed out").
        if let lostReason { throw Failure.linkLost(lostReason) }
        if closed { throw Failure.linkLost(.localHost) }
        while true {
            let remaining = deadline - clock.now
            guard remaining > .zero else { throw Failure.timedOut("waiting for the box") }
            let event = try await nextLinkEvent(within: remaining)
            switch event {
            case nil:
                throw Failure.timedOut("waiting for the box")
            case .disconnected(let reason)?:
                connection.close()
                lostReason = reason
                throw Failure.linkLost(reason)
            case .notification(let c, let value)? where c == BoxkeyProtocol.responseCharacteristicUUID:
                if value.starts(with: channel.bytes) { heardAt = clock.now }
                let message: [UInt8]?
                do { message = try reassembler.receive(value, mtu: mtu, now: clock.now) } catch {
                    throw Failure.protocolError("bad fragment: \(error)")
                }
                guard let message else { continue }
                // The handshake's answer again: message 1 went twice and the box answered both.
                if message == firstAnswer { continue }
                do {
                    let event = try connection.receive(message)
                    if event == .channelOpen { firstAnswer = message }
                    return event
                } catch {
                    switch error {
                    case .refused(let r): throw Failure.refused(r)
                    case .boxAuthenticationFailed: throw Failure.keyChanged
                    case .pairingFailed: throw Failure.pairingFailed
                    default: throw Failure.protocolError("\(error)")
                    }
                }
            case .notification?:
                continue
            }
        }
    }

    private func nextLinkEvent(within timeout: Duration) async throws -> LinkEvent? {
        await inbox.take(within: timeout)
    }

    /// Fragments are Write Commands, the last one a Write Request when `confirmed`: the phone
    /// learns it arrived.
    private func write(_ envelope: [UInt8], confirmed: Bool = true) async throws {
        do {
            let fragments = try Framing.fragment(envelope, mtu: mtu, channel: channel)
            for (i, f) in fragments.enumerated() {
                try await link.write(BoxkeyProtocol.requestCharacteristicUUID, value: f, withResponse: confirmed && i == fragments.count - 1)
            }
        } catch let e as RadioError {
            if case .disconnected(let r) = e {
                lostReason = r
                throw Failure.linkLost(r)
            }
            throw Failure.radio("\(e)")
        }
    }

    public func rssi() async -> Int? { try? await link.rssi() }

    /// On the simulated radio: the connection events this link used so far, from the
    /// connection's first event to the last one that carried data, and the ATT value bytes
    /// both ways. nil on other radios.
    public nonisolated var airStatistics: (events: Int, bytes: Int, packets: Int)? {
        guard let simulated = link as? SimulatedLinkStatistics else { return nil }
        return simulated.statistics
    }

    /// Ends the link: notifications off first, then the disconnect. Closing twice is a no-op.
    public func close() async {
        guard !closed else { return }
        closed = true
        connection.close()
        try? await link.unsubscribe(BoxkeyProtocol.responseCharacteristicUUID)
        await link.disconnect()
    }
}


