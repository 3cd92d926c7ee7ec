@testable import BoxkeyCore
import Testing

@Suite struct SecureSlabTests {
    @Test func slotsKeepTheirContentsAcrossChunksAndComeBackWiped() {
        // More than one chunk's worth alive at once, each with its own contents.
        let many = (0..<(SecureSlab.slotsPerChunk * 2 + 7)).map { i in
            SecureBytes(count: 32) { buffer in for j in 0..<32 { buffer[j] = UInt8(truncatingIfNeeded: i &* 31 &+ j) } }
        }
        for (i, s) in many.enumerated() {
            #expect(s.unprotectedCopy == (0..<32).map { UInt8(truncatingIfNeeded: i &* 31 &+ $0) })
        }
        // Released slots are reused, and a new buffer never shows an old secret.
        var secrets: [SecureBytes]? = (0..<64).map { _ in SecureBytes.random(count: SecureSlab.slotSize) }
        secrets = nil
        _ = secrets
        for _ in 0..<64 { #expect(SecureBytes(count: SecureSlab.slotSize).unprotectedCopy.allSatisfy { $0 == 0 }) }
        // Larger secrets still get their own sodium_malloc.
        #expect(SecureBytes(count: SecureSlab.slotSize + 1).unprotectedCopy.count == SecureSlab.slotSize + 1)
    }
}
