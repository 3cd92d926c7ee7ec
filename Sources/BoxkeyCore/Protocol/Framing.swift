/// GATT framing: one envelope is split into fragments that each fit one ATT write or
/// notification (ATT_MTU - 3 bytes of value).
///
///     fragment 0:   index (1) = 0 | total length (2, BE) | data
///     fragment i:   index (1) = i | data                      (i = 1 ... 63)
///
/// BLE's link layer is reliable and in order, so the reassembler accepts only the next index:
/// anything else means a broken or hostile peer and is an error, never silently repaired.
public enum Framing {
    public static let headerLength = 1
    public static let lengthFieldLength = 2
    /// Index values 64...255 are reserved (future flags) and rejected.
    public static let maxFragments = 64
    /// A whole envelope must arrive within this time of its first fragment. At the slowest
    /// legal timing (MTU 23, one packet per 4 s connection interval) 54 fragments would not
    /// make it, but at any interval a real phone uses (7.5-100 ms) the largest message takes
    /// well under a second.
    public static let reassemblyTimeout: Duration = .seconds(5)

    /// Largest fragment value for an ATT MTU.
    public static func fragmentCapacity(mtu: Int) -> Int {
        min(max(mtu, BoxkeyProtocol.minimumATTMTU), BoxkeyProtocol.maximumATTMTU) - BoxkeyProtocol.attHeaderLength
    }

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
        /// A continuation arrived with no message in progress.
        case unexpectedContinuation(index: UInt8)
        /// The same fragment index arrived twice in a row.
        case duplicateFragment(index: UInt8)
        case outOfOrder(expected: UInt8, got: UInt8)
        /// A new message started before the previous one was complete.
        case truncatedMessage(received: Int, declared: Int)
        /// The fragments carry more bytes than the first fragment declared.
        case overrun(declared: Int)
        case tooManyFragments
        case timedOut
    }

    /// Splits `message` for `mtu`. Throws for messages the reassembler would refuse, so a sender
    /// learns of an oversize message before it reaches the air.
    public static func fragment(_ message: [UInt8], mtu: Int) throws(Framing.Error) -> [[UInt8]] {
        guard !message.isEmpty else { throw .emptyMessage }
        guard message.count <= Envelope.maxLength else { throw .messageTooLarge(length: message.count, limit: Envelope.maxLength) }
        let capacity = fragmentCapacity(mtu: mtu)
        var fragments: [[UInt8]] = []
        var offset = 0
        var index: UInt8 = 0
        while offset < message.count {
            var fragment: [UInt8] = [index]
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
public struct FrameReassembler: Sendable {
    public let maxMessageLength: Int
    public let timeout: Duration

    private var buffer: [UInt8] = []
    private var declaredLength = 0
    private var nextIndex: UInt8 = 0
    private var startedAt: Duration = .zero
    private var inProgress = false

    public init(maxMessageLength: Int = Envelope.maxLength, timeout: Duration = Framing.reassemblyTimeout) {
        self.maxMessageLength = maxMessageLength
        self.timeout = timeout
    }

    public var isIdle: Bool { !inProgress }

    /// Feeds one ATT value received at time `now` with link MTU `mtu`. Returns a complete
    /// message when this fragment finished one.
    public mutating func receive(_ fragment: [UInt8], mtu: Int, now: Duration) throws(Framing.Error) -> [UInt8]? {
        do {
            return try accept(fragment, mtu: mtu, now: now)
        } catch {
            reset()
            throw error
        }
    }

    /// Reports (and clears) a message whose time ran out. Call on a timer or before `receive`.
    public mutating func checkTimeout(now: Duration) throws(Framing.Error) {
        if inProgress, now - startedAt > timeout {
            reset()
            throw .timedOut
        }
    }

    public mutating func reset() {
        buffer.removeAll(keepingCapacity: false)
        declaredLength = 0
        nextIndex = 0
        inProgress = false
    }

    private mutating func accept(_ fragment: [UInt8], mtu: Int, now: Duration) throws(Framing.Error) -> [UInt8]? {
        let limit = Framing.fragmentCapacity(mtu: mtu)
        guard !fragment.isEmpty else { throw .emptyFragment }
        guard fragment.count <= limit else { throw .fragmentTooLarge(length: fragment.count, limit: limit) }
        let index = fragment[0]
        guard Int(index) < Framing.maxFragments else { throw .reservedIndex(index) }
        try checkTimeout(now: now)

        if index == 0 {
            if inProgress { throw .truncatedMessage(received: buffer.count, declared: declaredLength) }
            guard fragment.count >= Framing.headerLength + Framing.lengthFieldLength else { throw .truncatedHeader }
            let length = Int(fragment[1]) << 8 | Int(fragment[2])
            guard length > 0 else { throw .emptyMessage }
            guard length <= maxMessageLength else { throw .messageTooLarge(length: length, limit: maxMessageLength) }
            guard fragment.count > 3 else { throw .emptyFragment }
            declaredLength = length
            buffer.reserveCapacity(length)
            startedAt = now
            inProgress = true
            nextIndex = 1
            return try append(fragment[3...])
        }

        guard inProgress else { throw .unexpectedContinuation(index: index) }
        if index == nextIndex &- 1 { throw .duplicateFragment(index: index) }
        guard index == nextIndex else { throw .outOfOrder(expected: nextIndex, got: index) }
        guard fragment.count > 1 else { throw .emptyFragment }
        nextIndex &+= 1
        return try append(fragment[1...])
    }

    private mutating func append(_ data: ArraySlice<UInt8>) throws(Framing.Error) -> [UInt8]? {
        guard buffer.count + data.count <= declaredLength else { throw .overrun(declared: declaredLength) }
        buffer += data
        if buffer.count == declaredLength {
            let message = buffer
            reset()
            return message
        }
        guard Int(nextIndex) < Framing.maxFragments else { throw .tooManyFragments }
        return nil
    }
}
