import BoxkeyCore
import Testing

@Suite struct FleetCertificateTests {
    let fleet = Ed25519.KeyPair.generate()
    let box = KeyPair.generate().publicKey
    let id = BoxID("4822")!
    let now: Int64 = 1_800_000_000

    func certificate(serial: UInt64 = 7, notAfter: Int64? = nil, by key: Ed25519.KeyPair? = nil) -> BoxCertificate {
        BoxCertificate.issue(boxKey: box, boxID: id, serial: serial, notBefore: now - 60, notAfter: notAfter ?? now + 86_400, by: key ?? fleet)
    }

    func list(_ serials: [UInt64] = [], number: UInt64 = 3, nextUpdate: Int64? = nil) -> BoxRevocationList {
        try! BoxRevocationList.issue(number: number, issued: now - 10, nextUpdate: nextUpdate ?? now + 86_400, serials: serials, by: fleet)
    }

    func check(_ part: [UInt8], boxID: BoxID? = nil, newest: UInt64 = 0, trusted: [Ed25519.PublicKey]? = nil) throws(FleetCheck.Refusal) {
        _ = try FleetCheck.verify(part, boxID: boxID ?? id, boxKey: box, trusted: trusted ?? [fleet.publicKey], newestSeen: { _ in newest }, now: now)
    }

    @Test func aCertifiedBoxWithACurrentListPasses() throws {
        let cert = certificate()
        #expect(try BoxCertificate.decode(cert.encode()) == cert)
        #expect(cert.encode().count == BoxCertificate.length)
        let l = list([1, 2])
        #expect(try BoxRevocationList.decode(l.encode()) == l)
        let (c, seen, key) = try FleetCheck.verify(cert.encode() + l.encode(), boxID: id, boxKey: box, trusted: [fleet.publicKey], newestSeen: { _ in 3 }, now: now)
        #expect(c == cert && seen.number == 3 && key == fleet.publicKey)
        // Info carries it after ID and key, and round-trips.
        let info = BoxInfo(boxID: id, staticKey: box, fleet: cert.encode() + l.encode())
        #expect(try BoxInfo.decode(info.encode()) == info && info.encode().count <= BoxInfo.maxLength)
    }

    @Test func everyReasonToRefuseIsItsOwn() {
        let cert = certificate(), l = list()
        #expect(throws: FleetCheck.Refusal.noCertificate) { try check([]) }
        #expect(throws: FleetCheck.Refusal.notByATrustedFleetKey) { try check(certificate(by: .generate()).encode() + l.encode()) }
        #expect(throws: FleetCheck.Refusal.notByATrustedFleetKey) { try check(cert.encode() + l.encode(), trusted: [Ed25519.KeyPair.generate().publicKey]) }
        #expect(throws: FleetCheck.Refusal.otherBox(id)) { try check(cert.encode() + l.encode(), boxID: BoxID("4821")!) }
        #expect(throws: FleetCheck.Refusal.expired(now - 400)) { try check(certificate(notAfter: now - 400).encode() + l.encode()) }
        #expect(throws: FleetCheck.Refusal.noCurrentRevocationList) { try check(cert.encode()) }
        #expect(throws: FleetCheck.Refusal.revocationListExpired(now - 1)) { try check(cert.encode() + list(nextUpdate: now - 1).encode()) }
        #expect(throws: FleetCheck.Refusal.olderRevocationList(seen: 4, served: 3)) { try check(cert.encode() + l.encode(), newest: 4) }
        #expect(throws: FleetCheck.Refusal.revoked(serial: 7)) { try check(cert.encode() + list([9, 7]).encode()) }
    }

    /// A phone keeps the newest list a trusted key signed, even from a box it refuses (here: a
    /// certificate for another box); a list no trusted key signed is not kept.
    @Test func aSignedListIsKeptEvenFromARefusedBox() {
        let part = certificate().encode() + list(number: 9).encode()
        #expect(throws: FleetCheck.Refusal.otherBox(id)) { try check(part, boxID: BoxID("4821")!) }
        #expect(FleetCheck.revocationList(in: part, trusted: [fleet.publicKey])?.0.number == 9)
        #expect(FleetCheck.revocationList(in: part, trusted: [Ed25519.KeyPair.generate().publicKey]) == nil)
        #expect(FleetCheck.revocationList(in: certificate().encode(), trusted: [fleet.publicKey]) == nil)
    }

    /// Any flipped bit in the certificate or the list is refused: the signature covers it all.
    @Test func aTamperedCertificateOrListIsRefused() {
        let part = certificate().encode() + list([5]).encode()
        for i in stride(from: 0, to: part.count, by: 3) {
            var bad = part
            bad[i] ^= 0x20
            #expect(throws: FleetCheck.Refusal.self) { try check(bad) }
        }
    }

    @Test func malformedCertificatesAndListsAreErrors() {
        #expect(throws: BoxCertificate.DecodeError.wrongLength(10)) { try BoxCertificate.decode([UInt8](repeating: 1, count: 10)) }
        var v2 = certificate().encode()
        v2[0] = 2
        #expect(throws: BoxCertificate.DecodeError.unknownVersion(2)) { try BoxCertificate.decode(v2) }
        var many = list().encode()
        many[25] = 200
        #expect(throws: BoxRevocationList.DecodeError.tooManySerials(200)) { try BoxRevocationList.decode(many) }
        #expect(throws: BoxRevocationList.DecodeError.tooManySerials(33)) {
            try BoxRevocationList.issue(number: 1, issued: 0, nextUpdate: 1, serials: Array(1...33), by: fleet)
        }
        #expect(throws: BoxRevocationList.DecodeError.wrongLength(list().encode().count - 1)) { try BoxRevocationList.decode(list().encode().dropLast()) }
    }

    @Test func aFleetKeyIsItsSeed() throws {
        let again = try Ed25519.KeyPair(seed: fleet.seed)
        #expect(again.publicKey == fleet.publicKey)
        #expect(fleet.publicKey.verify(again.sign([1, 2, 3]), of: [1, 2, 3]))
        #expect(!fleet.publicKey.verify(again.sign([1, 2, 3]), of: [1, 2, 4]))
        #expect(base64Decode(base64Encode([0, 1, 2, 250])) == [0, 1, 2, 250])
        #expect(base64Decode("not base64!") == nil)
    }
}
