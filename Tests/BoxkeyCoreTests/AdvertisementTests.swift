import Testing
@testable import BoxkeyCore

@Suite struct AdvertisementTests {
    @Test func fullAdvertisingDataFitsLegacy31Bytes() {
        let ad = Fixtures.advertisement.advertisingData()
        #expect(ad.count == Advertisement.legacyAdvertisingDataLength)
        // Walk the AD structures: each is [length][type][data], lengths must add up exactly.
        var offset = 0
        var types: [UInt8] = []
        while offset < ad.count {
            let length = Int(ad[offset])
            #expect(length > 0)
            types.append(ad[offset + 1])
            offset += 1 + length
        }
        #expect(offset == ad.count)
        #expect(types == [0x01, 0x07, 0xff])
        // The service UUID is present little-endian; the manufacturer payload is last.
        #expect(Array(ad[5..<21]) == uuidBytesLittleEndian(BoxkeyProtocol.serviceUUID))
        #expect(Array(ad[23..<25]) == [0xff, 0xff])
        #expect(Array(ad[25...]) == Fixtures.advertisement.encode())
    }

    @Test func payloadRoundTrips() throws {
        var a = Fixtures.advertisement
        a.flags = [.loginPromptWaiting, .sessionActive]
        let bytes = a.encode()
        #expect(bytes.count == Advertisement.payloadLength)
        #expect(try Advertisement.decode(bytes) == a)
        #expect(bytes[0] == 0x53)   // version 5, flags 3
        #expect(Array(bytes[1...2]) == [0x12, 0xD5])   // 4821
    }

    @Test func decoderFailsClosed() {
        #expect(throws: Advertisement.DecodeError.wrongLength(5)) { try Advertisement.decode([1, 2, 3, 4, 5]) }
        #expect(throws: Advertisement.DecodeError.wrongLength(7)) { try Advertisement.decode([0x10, 0, 0, 0, 0, 0, 0]) }
        #expect(throws: Advertisement.DecodeError.unsupportedVersion(1)) { try Advertisement.decode([0x10, 0, 1, 0, 0, 0]) }
        #expect(throws: Advertisement.DecodeError.unsupportedVersion(2)) { try Advertisement.decode([0x20, 0, 1, 0, 0, 0]) }
        #expect(throws: Advertisement.DecodeError.unsupportedVersion(3)) { try Advertisement.decode([0x30, 0, 1, 0, 0, 0]) }
        #expect(throws: Advertisement.DecodeError.unsupportedVersion(4)) { try Advertisement.decode([0x40, 0, 1, 0, 0, 0]) }
        #expect(throws: Advertisement.DecodeError.unsupportedVersion(6)) { try Advertisement.decode([0x60, 0, 1, 0, 0, 0]) }
        #expect(throws: Advertisement.DecodeError.unsupportedVersion(0)) { try Advertisement.decode([0x00, 0, 1, 0, 0, 0]) }
        #expect(throws: Advertisement.DecodeError.invalidBoxID(10000)) { try Advertisement.decode([0x50, 0x27, 0x10, 0, 0, 0]) }
    }

    @Test func prologueBindsVersionIDAndNonceButNotFlags() {
        var a = Fixtures.advertisement
        let p = a.prologue
        a.flags = .loginPromptWaiting
        #expect(a.prologue == p)
        a.nonce &+= 1
        #expect(a.prologue != p)
        #expect(p == Array("BOXKEY".utf8) + [BoxkeyProtocol.version, 0x12, 0xD5, 0xBE, 0xEF])
    }

    @Test func boxIDsAreFourDigits() {
        #expect(BoxID("4821")?.value == 4821)
        #expect(BoxID("0042")?.description == "0042")
        #expect(BoxID("482") == nil)
        #expect(BoxID("48210") == nil)
        #expect(BoxID("48a1") == nil)
        #expect(BoxID(UInt16(10000)) == nil)
    }

    @Test func boxInfoRoundTripsAndFailsClosed() throws {
        let info = BoxInfo(boxID: Fixtures.boxID, staticKey: Fixtures.box.publicKey)
        #expect(try BoxInfo.decode(info.encode()) == info)
        #expect(info.encode().count == BoxInfo.length)
        #expect(throws: BoxInfo.DecodeError.wrongLength(35)) { try BoxInfo.decode(Array(info.encode().dropLast())) }
        var bad = info.encode(); bad[0] = 3; bad[1] = 2
        #expect(throws: BoxInfo.DecodeError.invalidVersionRange) { try BoxInfo.decode(bad) }
    }

    @Test func nonceWindowAcceptsCurrentAndPreviousOnly() {
        var n = AdvertisementNonces(current: 7)
        #expect(n.accepts(7) && !n.accepts(8))
        n.rotate()
        #expect(n.accepts(7) && n.accepts(n.current))
        let second = n.current
        n.rotate()
        #expect(!n.accepts(7) && n.accepts(second))
        #expect(n.live == [second, n.current])
    }
}
