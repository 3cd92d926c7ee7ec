import Testing
@testable import BoxkeyCore

@Suite struct FramingTests {
    func message(_ n: Int) -> [UInt8] { (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) } }

    @Test(arguments: [23, 24, 27, 50, 185, 247, 251, 512, 517])
    func everySizeRoundTripsAtMTU(_ mtu: Int) throws {
        for size in [1, 2, 16, 17, 18, 19, 20, 36, 37, 100, 255, 256, 697, 1024] {
            let m = message(size)
            let fragments = try Framing.fragment(m, mtu: mtu)
            #expect(fragments.count == Framing.fragmentCount(messageLength: size, mtu: mtu))
            #expect(fragments.allSatisfy { $0.count <= mtu - 3 })
            var r = FrameReassembler()
            var out: [UInt8]?
            for (i, f) in fragments.enumerated() {
                out = try r.receive(f, mtu: mtu, now: .milliseconds(i))
                #expect((out != nil) == (i == fragments.count - 1))
            }
            #expect(out == m)
            #expect(r.isIdle)
        }
    }

    @Test func handshakeMessagesAtMTU23() {
        #expect(Framing.fragmentCount(messageLength: Envelope.handshakeInitLength, mtu: 23) == 6)
        #expect(Framing.fragmentCount(messageLength: Envelope.handshakeResponseLength, mtu: 23) == 3)
        #expect(Framing.fragmentCount(messageLength: Envelope.maxLength, mtu: 23) == 54)
        #expect(Framing.fragmentCount(messageLength: Envelope.handshakeInitLength, mtu: 247) == 1)
    }

    @Test func senderRefusesOversizeAndEmptyMessages() {
        #expect(throws: Framing.Error.messageTooLarge(length: 1025, limit: 1024)) { try Framing.fragment(message(1025), mtu: 23) }
        #expect(throws: Framing.Error.emptyMessage) { try Framing.fragment([], mtu: 23) }
    }

    func fragments(_ size: Int = 100) -> [[UInt8]] { try! Framing.fragment(message(size), mtu: 23) }

    @Test func duplicateFragmentIsRejected() throws {
        let f = fragments()
        var r = FrameReassembler()
        _ = try r.receive(f[0], mtu: 23, now: .zero)
        _ = try r.receive(f[1], mtu: 23, now: .zero)
        #expect(throws: Framing.Error.duplicateFragment(index: 1)) { try r.receive(f[1], mtu: 23, now: .zero) }
        #expect(r.isIdle)
    }

    @Test func outOfOrderFragmentIsRejected() throws {
        let f = fragments()
        var r = FrameReassembler()
        _ = try r.receive(f[0], mtu: 23, now: .zero)
        #expect(throws: Framing.Error.outOfOrder(expected: 1, got: 2)) { try r.receive(f[2], mtu: 23, now: .zero) }
    }

    @Test func continuationWithoutStartIsRejected() {
        var r = FrameReassembler()
        #expect(throws: Framing.Error.unexpectedContinuation(index: 1)) { try r.receive(fragments()[1], mtu: 23, now: .zero) }
    }

    @Test func newMessageBeforeTheLastEndedIsTruncation() throws {
        let f = fragments()
        var r = FrameReassembler()
        _ = try r.receive(f[0], mtu: 23, now: .zero)
        _ = try r.receive(f[1], mtu: 23, now: .zero)
        #expect(throws: Framing.Error.truncatedMessage(received: 36, declared: 100)) { try r.receive(f[0], mtu: 23, now: .zero) }
        // The reassembler is usable again afterwards: nothing is lost for the next message.
        var out: [UInt8]?
        for x in f { out = try r.receive(x, mtu: 23, now: .zero) }
        #expect(out == message(100))
    }

    @Test func declaredLengthOverLimitIsRejectedAtTheFirstFragment() {
        var r = FrameReassembler()
        #expect(throws: Framing.Error.messageTooLarge(length: 0x0500, limit: 1024)) { try r.receive([0, 0x05, 0x00, 1], mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.emptyMessage) { try r.receive([0, 0, 0, 1], mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.truncatedHeader) { try r.receive([0, 1], mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.emptyFragment) { try r.receive([0, 0, 5], mtu: 23, now: .zero) }
    }

    @Test func moreDataThanDeclaredIsAnOverrun() throws {
        var r = FrameReassembler()
        _ = try r.receive([0, 0, 20] + [UInt8](repeating: 1, count: 17), mtu: 23, now: .zero)
        #expect(throws: Framing.Error.overrun(declared: 20)) { try r.receive([1, 1, 2, 3, 4], mtu: 23, now: .zero) }
    }

    @Test func fragmentLargerThanMTUIsRejected() {
        var r = FrameReassembler()
        #expect(throws: Framing.Error.fragmentTooLarge(length: 21, limit: 20)) { try r.receive([0, 0, 30] + [UInt8](repeating: 0, count: 18), mtu: 23, now: .zero) }
    }

    @Test func reservedIndexAndEmptyFragmentAreRejected() {
        var r = FrameReassembler()
        #expect(throws: Framing.Error.reservedIndex(64)) { try r.receive([64, 1], mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.reservedIndex(0xff)) { try r.receive([0xff, 1], mtu: 23, now: .zero) }
        #expect(throws: Framing.Error.emptyFragment) { try r.receive([], mtu: 23, now: .zero) }
    }

    @Test func slowMessageTimesOut() throws {
        let f = fragments()
        var r = FrameReassembler()
        _ = try r.receive(f[0], mtu: 23, now: .zero)
        _ = try r.receive(f[1], mtu: 23, now: .seconds(5))   // exactly at the limit is still fine
        #expect(throws: Framing.Error.timedOut) { try r.receive(f[2], mtu: 23, now: .milliseconds(5001)) }
        var idle = FrameReassembler()
        _ = try idle.receive(f[0], mtu: 23, now: .zero)
        #expect(throws: Framing.Error.timedOut) { try idle.checkTimeout(now: .seconds(6)) }
        #expect(idle.isIdle)
    }

    @Test func tooManyFragmentsIsRejected() throws {
        // A declared length that needs more than 64 fragments at MTU 23 cannot complete.
        var r = FrameReassembler(maxMessageLength: 2000)
        _ = try r.receive([0, 0x07, 0xD0] + [UInt8](repeating: 0, count: 17), mtu: 23, now: .zero)
        var thrown: Framing.Error?
        for i in 1..<64 {
            do { _ = try r.receive([UInt8(i)] + [UInt8](repeating: 0, count: 19), mtu: 23, now: .zero) } catch { thrown = error; break }
        }
        #expect(thrown == .tooManyFragments)
    }
}
