import Testing
@testable import BoxkeyCore

@Suite struct FramingTests {
    func message(_ n: Int) -> [UInt8] { (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) } }

    let ch = FrameChannel(0xA1B2_C3D4)
    /// A raw fragment on `ch`: the channel bytes, then `bytes` (index, length, data).
    func raw(_ bytes: [UInt8]) -> [UInt8] { [0xA1, 0xB2, 0xC3, 0xD4] + bytes }

    /// Every MTU a link can have: fragments fit what BlueZ really carries (MTU - 5 in a
    /// Multiple Handle Value Notification, never over 512) and come back whole.
    @Test func everySizeRoundTripsAtEveryMTU() throws {
        for mtu in 23...517 {
            for size in [1, 17, 18, 36, 50, 100, 255, 697, 1024] {
                let m = message(size)
                let fragments = try Framing.fragment(m, mtu: mtu, channel: ch)
                #expect(fragments.count == Framing.fragmentCount(messageLength: size, mtu: mtu))
                #expect(fragments.allSatisfy { $0.count <= mtu - 5 && $0.count <= 512 })
                var r = FrameReassembler()
                var out: [UInt8]?
                for (i, f) in fragments.enumerated() {
                    out = try r.receive(f, mtu: mtu, now: .milliseconds(i))
                    #expect((out != nil) == (i == fragments.count - 1))
                }
                #expect(out == m)
                #expect(r.isIdle && r.channel == ch)
            }
        }
    }

    @Test func capacityAndReceiveLimit() {
        #expect(Framing.fragmentCapacity(mtu: 23) == 18)
        #expect(Framing.fragmentCapacity(mtu: 517) == 512)
        #expect(Framing.fragmentCapacity(mtu: 515) == 510)
        #expect(Framing.receiveLimit(mtu: 23) == 20)
        #expect(Framing.receiveLimit(mtu: 517) == 512)
    }

    /// BlueZ sends every notification to every subscribed central: two phones' replies arrive
    /// interleaved, and each phone's reassembler keeps only its own channel.
    @Test func phoneKeepsOnlyItsOwnChannel() throws {
        let mine = FrameChannel(1), theirs = FrameChannel(2)
        let a = try Framing.fragment(message(100), mtu: 23, channel: mine)
        let b = try Framing.fragment(message(60).reversed(), mtu: 23, channel: theirs)
        var r = FrameReassembler(channel: mine)
        var got: [[UInt8]] = []
        for i in 0..<max(a.count, b.count) {
            for f in [i < b.count ? b[i] : nil, i < a.count ? a[i] : nil].compactMap({ $0 }) {
                if let m = try r.receive(f, mtu: 23, now: .zero) { got.append(m) }
            }
        }
        #expect(got == [message(100)])
        #expect(r.foreignFragments == b.count)
    }

    /// The box learns a connection's channel from its first fragment; another one later is a
    /// broken or hostile peer.
    @Test func boxRefusesAChangedChannel() throws {
        var r = FrameReassembler()
        _ = try r.receive(try Framing.fragment(message(10), mtu: 23, channel: ch)[0], mtu: 23, now: .zero)
        let other = try Framing.fragment(message(10), mtu: 23, channel: FrameChannel(7))[0]
        #expect(throws: Framing.Error.channelChanged(expected: ch, got: FrameChannel(7))) { try r.receive(other, mtu: 23, now: .zero) }
        #expect(r.channel == ch)
    }

    @Test func handshakeMessagesAtMTU23() {
        // 11 bytes of message in the first fragment, 13 in each later one.
        #expect(Framing.fragmentCount(messageLength: Envelope.handshakeInitLength, mtu: 23) == 8)
        #expect(Framing.fragmentCount(messageLength: Envelope.handshakeResponseLength, mtu: 23) == 4)
        #expect(Framing.fragmentCount(messageLength: Envelope.maxLength, mtu: 23) == 79)
        #expect(Framing.fragmentCount(messageLength: Envelope.handshakeInitLength, mtu: 247) == 1)
    }

    @Test func senderRefusesOversizeAndEmptyMessages() {
        #expect(throws: Framing.Error.messageTooLarge(length: 1025, limit: 1024)) { try Framing.fragment(message(1025), mtu: 23, channel: ch) }
        #expect(throws: Framing.Error.emptyMessage) { try Framing.fragment([], mtu: 23, channel: ch) }
    }

    func fragments(_ size: Int = 100) -> [[UInt8]] { try! Framing.fragment(message(size), mtu: 23, channel: ch) }

    @Test func duplicateFragmentIsRejected() throws {
        let f = fragments()
        var r = FrameReassembler()
        _ = try r.receive(f[0], mtu: 23, now: .zero)
        _ = try r.receive(f[1], mtu: 23, now: .zero)
        #expect(throws: Framing.Error.duplicateFragment(index: 1)) { try r.receive(f[1], mtu: 23, now: .zero) }
        #expect(r.isIdle)
    }

    /// Seen over real BlueZ with EATT (the lab at MTU 48): the box's three notifications went out
    /// on bearers 1, 0, 1 and the phone's bluetoothd delivered the second one first.
    @Test func fragmentsArrivingInAnyOrderMakeTheMessage() throws {
        let f = fragments()
        for order in [[1, 0, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1, 0], [2, 0, 1, 4, 3, 6, 5, 7], [0, 2, 4, 6, 1, 3, 5, 7]] {
            var r = FrameReassembler()
            var out: [UInt8]?
            for (n, i) in order.enumerated() {
                out = try r.receive(f[i], mtu: 23, now: .zero)
                #expect((out == nil) == (n < order.count - 1))
            }
            #expect(out == message(100))
            #expect(r.isIdle)
        }
    }

    @Test func aContinuationAloneWaitsForItsStartThenTimesOut() throws {
        var r = FrameReassembler()
        #expect(try r.receive(fragments()[1], mtu: 23, now: .zero) == nil)
        #expect(r.deadline == Framing.reassemblyTimeout)
        #expect(throws: Framing.Error.timedOut) { try r.checkTimeout(now: Framing.reassemblyTimeout) }
        #expect(r.isIdle)
    }

    @Test func continuationsAheadOfTheirStartAreBoundedByOneMessage() throws {
        var r = FrameReassembler()
        // 80 continuations of 13 bytes: 1,040 bytes, more than any envelope.
        for i in 1...78 { #expect(try r.receive(raw([UInt8(i)] + [UInt8](repeating: 1, count: 13)), mtu: 23, now: .zero) == nil) }
        #expect(throws: Framing.Error.messageTooLarge(length: 1027, limit: 1024)) {
            try r.receive(raw([79] + [UInt8](repeating: 1, count: 13)), mtu: 23, now: .zero)
        }
        #expect(r.isIdle)
    }

    @Test func aGapFilledByMoreBytesThanDeclaredIsAnOverrun() throws {
        var r = FrameReassembler()
        // Declares 20: 13 in fragment 0 and 7 in fragment 2 add up, but fragment 1 is missing.
        _ = try r.receive(raw([0, 0, 20] + [UInt8](repeating: 1, count: 13)), mtu: 23, now: .zero)
        #expect(throws: Framing.Error.overrun(declared: 20)) { try r.receive(raw([2] + [UInt8](repeating: 2, count: 7)), mtu: 23, now: .zero) }
    }

    @Test func aSecondFragmentZeroIsTruncationEvenOutOfOrder() throws {
        let f = fragments()
        var r = FrameReassembler()
        _ = try r.receive(f[2], mtu: 23, now: .zero)
        _ = try r.receive(f[0], mtu: 23, now: .zero)
        #expect(throws: Framing.Error.truncatedMessage(received: 24, declared: 100)) { try r.receive(f[0], mtu: 23, now: .zero) }
    }

    @Test func newMessageBeforeTheLastEndedIsTruncation() throws {
        let f = fragments()
        var r = FrameReassembler()
        _ = try r.receive(f[0], mtu: 23, now: .zero)
        _ = try r.receive(f[1], mtu: 23, now: .zero)
        #expect(throws: Framing.Error.truncatedMessage(received: 24, declared: 100)) { try r.receive(f[0], mtu: 23, now: .zero) }
        // The reassembler is usable again afterwards: nothing is lost for the next message.
        var out: [UInt8]?
        for x in f { out = try r.receive(x, mtu: 23, now: .zero) }
        #expect(out == message(100))
    }

    @Test func declaredLengthOverLimitIsRejectedAtTheFirstFragment() {
        var r = FrameReassembler()
        #expect(throws: Framing.Error.messageTooLarge(length: 0x0500, limit: 1024)) { try r.receive(raw([0, 0x05, 0x00, 1]), mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.emptyMessage) { try r.receive(raw([0, 0, 0, 1]), mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.truncatedHeader) { try r.receive(raw([0, 1]), mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.emptyFragment) { try r.receive(raw([0, 0, 5]), mtu: 23, now: .zero) }
    }

    @Test func moreDataThanDeclaredIsAnOverrun() throws {
        var r = FrameReassembler()
        _ = try r.receive(raw([0, 0, 20] + [UInt8](repeating: 1, count: 13)), mtu: 23, now: .zero)
        #expect(throws: Framing.Error.overrun(declared: 20)) { try r.receive(raw([1, 1, 2, 3, 4, 5, 6, 7, 8]), mtu: 23, now: .zero) }
    }

    @Test func fragmentLargerThanMTUIsRejected() {
        var r = FrameReassembler()
        #expect(throws: Framing.Error.fragmentTooLarge(length: 21, limit: 20)) { try r.receive(raw([0, 0, 30] + [UInt8](repeating: 0, count: 14)), mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.fragmentTooLarge(length: 513, limit: 512)) { try r.receive(raw([0, 2, 0] + [UInt8](repeating: 0, count: 506)), mtu: 517, now: .zero) }
    }

    @Test func reservedIndexAndEmptyFragmentAreRejected() {
        var r = FrameReassembler()
        #expect(throws: Framing.Error.reservedIndex(128)) { try r.receive(raw([128, 1]), mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.reservedIndex(0xff)) { try r.receive(raw([0xff, 1]), mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.emptyFragment) { try r.receive([], mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.emptyFragment) { try r.receive([0xA1, 0xB2, 0xC3, 0xD4], mtu: 23, now: .zero) }
    }

    @Test func slowMessageTimesOut() throws {
        let f = fragments()
        var r = FrameReassembler()
        _ = try r.receive(f[0], mtu: 23, now: .zero)
        _ = try r.receive(f[1], mtu: 23, now: .milliseconds(4999))
        #expect(r.deadline == .seconds(5))
        #expect(throws: Framing.Error.timedOut) { try r.receive(f[2], mtu: 23, now: .seconds(5)) }
        var idle = FrameReassembler()
        _ = try idle.receive(f[0], mtu: 23, now: .zero)
        #expect(throws: Framing.Error.timedOut) { try idle.checkTimeout(now: .seconds(6)) }
        #expect(idle.isIdle)
    }

    @Test func tooManyFragmentsIsRejected() throws {
        // A declared length that needs more than 128 fragments at MTU 23 cannot complete.
        var r = FrameReassembler(maxMessageLength: 2000)
        _ = try r.receive(raw([0, 0x07, 0xD0] + [UInt8](repeating: 0, count: 13)), mtu: 23, now: .zero)
        var thrown: Framing.Error?
        for i in 1..<128 {
            do { _ = try r.receive(raw([UInt8(i)] + [UInt8](repeating: 0, count: 15)), mtu: 23, now: .zero) } catch { thrown = error; break }
        }
        #expect(thrown == .tooManyFragments)
    }
}
