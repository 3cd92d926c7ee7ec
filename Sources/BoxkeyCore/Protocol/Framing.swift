/// Which connection a fragment belongs to. BlueZ's GATT server sends a characteristic's
/// notifications to every subscribed central, so every fragment names its connection: the phone
/// picks a random channel for each connection, the box answers on it, and a phone keeps only
/// fragments on its own channel, before any decryption.
public struct FrameChannel: Hashable, Sendable, CustomStringConvertible {
    public let value: UInt32
    public init(_ value: UInt32) { self.value = value }
    /// A fresh channel for a new connection (libsodium's generator).
    public static func random() -> FrameChannel {
        FrameChannel(SystemRandom.bytes(4).reduce(0) { $0 << 8 | UInt32($1) })
    }
    public var bytes: [UInt8] { [UInt8(value >> 24), UInt8(value >> 16 & 0xff), UInt8(value >> 8 & 0xff), UInt8(value & 0xff)] }
    public var description: String { hex(bytes) }
    /// The channel a fragment names, whatever the rest of it is; nil for one too short to name one.
    public static func named(by fragment: [UInt8]) -> FrameChannel? {
        guard fragment.count > Framing.channelLength else { return nil }
        return FrameChannel(fragment[0..<Framing.channelLength].reduce(0) { $0 << 8 | UInt32($1) })
    }
}

/// GATT framing: one envelope is split into fragments that each fit one ATT write or
/// notification.
///
///     fragment 0:   channel (4) | index (1) = 0 | total length (2, BE) | data
///     fragment i:   channel (4) | index (1) = i | data                      (i = 1 ... 127)
///
/// BLE's link layer is reliable, but one message's fragments can arrive out of order: with
/// Enhanced ATT, BlueZ spreads notifications and write commands over several bearers (each an
/// L2CAP channel of its own) and the receiving bluetoothd reads them in whatever order its
/// sockets wake. So the reassembler places fragments by index; a repeated index, more bytes
/// than declared or a second fragment 0 means a broken or hostile peer and is an error.
public enum Framing {
    public static let channelLength = 4
    /// Channel and index: the bytes every fragment starts with.
    public static let headerLength = channelLength + 1
    public static let lengthFieldLength = 2
    /// Index values 128...255 are reserved (future flags) and rejected. 128 fragments hold the
    /// largest envelope at MTU 23 (79 of them).
    public static let maxFragments = 128
    /// A whole envelope must arrive within this time of its first fragment. At the slowest
    /// legal timing (MTU 23, one packet per 4 s connection interval) 54 fragments would not
    /// make it, but at any interval a real phone uses (7.5-100 ms) the largest message takes
    /// well under a second.
    public static let reassemblyTimeout: Duration = .seconds(5)

    /// Largest fragment a sender makes at an ATT MTU: what the smallest carrier holds. BlueZ
    /// (5.62 and later) sends notifications in Multiple Handle Value Notification PDUs, whose
    /// handle and length fields leave MTU - 5 bytes of value, and drops the rest without an
    /// error; no attribute value may exceed 512 bytes.
    public static func fragmentCapacity(mtu: Int) -> Int {
        min(clamped(mtu) - BoxkeyProtocol.multipleNotificationHeaderLength, BoxkeyProtocol.maximumAttributeValueLength)
    }

    /// Largest fragment a receiver accepts at an ATT MTU: what a Write Request or a plain
    /// notification can carry (MTU - 3, at most 512).
    public static func receiveLimit(mtu: Int) -> Int {
        min(clamped(mtu) - BoxkeyProtocol.attHeaderLength, BoxkeyProtocol.maximumAttributeValueLength)
    }

    static func clamped(_ mtu: Int) -> Int { min(max(mtu, BoxkeyProtocol.minimumATTMTU), BoxkeyProtocol.maximumATTMTU) }

    /// How many fragments a message of `length` bytes needs at `mtu`.
    public static func fragmentCount(messageLength length: Int, mtu: Int) -> Int {
        let capacity = fragmentCapacity(mtu: mtu)
        let first = capacity - headerLength - lengthFieldLength
        if length <= first { return 1 }
        let rest = capacity - headerLength
        return 1 + (length - first + rest - 1) / rest
    }

    public enum Error: Swift.Error, Equatable, Sendable {
        case emptyMessage
        case messageTooLarge(length: Int, limit: Int)
        case emptyFragment
        case fragmentTooLarge(length: Int, limit: Int)
        case reservedIndex(UInt8)
        /// A first fragment too short to hold its length field.
        case truncatedHeader
        /// The same fragment index arrived twice in one message.
        case duplicateFragment(index: UInt8)
        /// A new message started before the previous one was complete.
        case truncatedMessage(received: Int, declared: Int)
        /// The fragments carry more bytes than the first fragment declared.
        case overrun(declared: Int)
        case tooManyFragments
        case timedOut
        /// A fragment on another channel than the connection's first one (the box's side).
        case channelChanged(expected: FrameChannel, got: FrameChannel)
    }

    /// Splits `message` for `mtu`. Throws for messages the reassembler would refuse, so a sender
    /// learns of an oversize message before it reaches the air.
    public static func fragment(_ message: [UInt8], mtu: Int, channel: FrameChannel) throws(Framing.Error) -> [[UInt8]] {
        guard !message.isEmpty else { throw .emptyMessage }
        guard message.count <= Envelope.maxLength else { throw .messageTooLarge(length: message.count, limit: Envelope.maxLength) }
        let capacity = fragmentCapacity(mtu: mtu)
        var fragments: [[UInt8]] = []
        var offset = 0
        var index: UInt8 = 0
        while offset < message.count {
            var fragment = channel.bytes + [index]
            if index == 0 { fragment += [UInt8(message.count >> 8), UInt8(message.count & 0xff)] }
            let take = min(capacity - fragment.count, message.count - offset)
            fragment += message[offset..<offset + take]
            offset += take
            fragments.append(fragment)
            index += 1
        }
        guard fragments.count <= maxFragments else { throw .tooManyFragments }
        return fragments
    }
}

/// Rebuilds envelopes from fragments, one connection's worth. Pure: the caller passes the time.
/// After any error the reassembler is empty again and ready for a new first fragment; the
/// caller decides whether the connection survives (the box drops it).
///
/// The phone's reassembler is made with its own channel and passes over fragments on other
/// channels (other phones' traffic). The box's learns the channel from the connection's first
/// fragment and refuses any other afterwards.
public struct FrameReassembler: Sendable {
    public let maxMessageLength: Int
    public let timeout: Duration
    /// The connection's channel: given (phone) or learned from the first fragment (box).
    public private(set) var channel: FrameChannel?
    private let keepsOnlyItsChannel: Bool
    /// Fragments passed over because they were on another channel.
    public private(set) var foreignFragments = 0

    /// The message in progress, by fragment index: fragments may arrive in any order (EATT).
    private var pieces: [UInt8: ArraySlice<UInt8>] = [:]
    private var receivedBytes = 0
    /// From fragment 0; nil until it arrives.
    private var declaredLength: Int?
    private var startedAt: Duration = .zero
    private var inProgress = false

    public init(channel: FrameChannel? = nil, maxMessageLength: Int = Envelope.maxLength, timeout: Duration = Framing.reassemblyTimeout) {
        self.channel = channel
        keepsOnlyItsChannel = channel != nil
        self.maxMessageLength = maxMessageLength
        self.timeout = timeout
    }

    public var isIdle: Bool { !inProgress }

    /// The message in progress has its first fragment: its start was not lost.
    public var hasFirstFragment: Bool { declaredLength != nil }

    /// When the message in progress runs out of time; nil when idle.
    public var deadline: Duration? { inProgress ? startedAt + timeout : nil }

    /// Feeds one ATT value received at time `now` with link MTU `mtu`. Returns a complete
    /// message when this fragment finished one.
    public mutating func receive(_ fragment: [UInt8], mtu: Int, now: Duration) throws(Framing.Error) -> [UInt8]? {
        let learned = channel
        do {
            return try accept(fragment, mtu: mtu, now: now)
        } catch {
            // A channel is learned only from a fragment that is whole: a broken first fragment
            // names none, so nothing is ever said on a channel copied into one.
            channel = learned
            reset()
            throw error
        }
    }

    /// Reports (and clears) a message whose time ran out. Call on a timer or before `receive`.
    public mutating func checkTimeout(now: Duration) throws(Framing.Error) {
        if inProgress, now - startedAt >= timeout {
            reset()
            throw .timedOut
        }
    }

    public mutating func reset() {
        pieces.removeAll(keepingCapacity: false)
        receivedBytes = 0
        declaredLength = nil
        inProgress = false
    }

    private mutating func accept(_ fragment: [UInt8], mtu: Int, now: Duration) throws(Framing.Error) -> [UInt8]? {
        guard let on = FrameChannel.named(by: fragment) else { throw .emptyFragment }
        if let channel, on != channel {
            // Another phone's traffic is none of this phone's business, whatever its shape.
            if keepsOnlyItsChannel { foreignFragments += 1; return nil }
            throw .channelChanged(expected: channel, got: on)
        }
        let limit = Framing.receiveLimit(mtu: mtu)
        guard fragment.count <= limit else { throw .fragmentTooLarge(length: fragment.count, limit: limit) }
        channel = on
        let fragment = fragment[Framing.channelLength...]
        let index = fragment[fragment.startIndex]
        guard Int(index) < Framing.maxFragments else { throw .reservedIndex(index) }
        try checkTimeout(now: now)

        if !inProgress {
            inProgress = true
            startedAt = now
        }
        let data: ArraySlice<UInt8>
        if index == 0 {
            if let declaredLength { throw .truncatedMessage(received: receivedBytes, declared: declaredLength) }
            let s = fragment.startIndex
            guard fragment.count >= 3 else { throw .truncatedHeader }
            let length = Int(fragment[s + 1]) << 8 | Int(fragment[s + 2])
            guard length > 0 else { throw .emptyMessage }
            guard length <= maxMessageLength else { throw .messageTooLarge(length: length, limit: maxMessageLength) }
            guard fragment.count > 3 else { throw .emptyFragment }
            declaredLength = length
            data = fragment[(s + 3)...]
        } else {
            guard pieces[index] == nil else { throw .duplicateFragment(index: index) }
            guard fragment.count > 1 else { throw .emptyFragment }
            data = fragment[(fragment.startIndex + 1)...]
        }
        pieces[index] = data
        receivedBytes += data.count
        guard let declared = declaredLength else {
            // Continuations ahead of their fragment 0 are held, as much as one message can be.
            guard receivedBytes <= maxMessageLength else { throw .messageTooLarge(length: receivedBytes, limit: maxMessageLength) }
            return nil
        }
        guard receivedBytes <= declared else { throw .overrun(declared: declared) }
        guard receivedBytes == declared else {
            // Every index is in and bytes are still missing: it can never complete.
            guard pieces.count < Framing.maxFragments else { throw .tooManyFragments }
            return nil
        }
        // Every byte is in: the indices must be 0 ..< count, since a missing fragment would be
        // at least one byte more than declared.
        guard pieces.keys.max()! == UInt8(pieces.count - 1) else { throw .overrun(declared: declared) }
        var message: [UInt8] = []
        message.reserveCapacity(declared)
        for i in 0..<UInt8(pieces.count) { message += pieces[i]! }
        reset()
        return message
    }
}
