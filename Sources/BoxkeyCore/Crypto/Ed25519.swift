import CSodium

/// Ed25519 (libsodium's crypto_sign), for the fleet key that certifies boxes: the fleet key's
/// secret half signs box certificates and revocation lists on an admin's machine; phones keep
/// the public half and verify.
public enum Ed25519 {
    public static let publicKeyLength = 32
    public static let seedLength = 32
    public static let signatureLength = 64

    public struct PublicKey: Sendable, Hashable, CustomStringConvertible {
        public let bytes: [UInt8]
        public init(_ bytes: some Collection<UInt8>) throws(CryptoError) {
            guard bytes.count == Ed25519.publicKeyLength else { throw .invalidLength(expected: Ed25519.publicKeyLength, actual: bytes.count) }
            self.bytes = Array(bytes)
        }
        /// As box and phone keys are shown.
        public var fingerprint: String { Fingerprint.of(bytes) }
        public var description: String { "FleetKey(\(fingerprint))" }

        public func verify(_ signature: some Collection<UInt8>, of message: [UInt8]) -> Bool {
            requireSodium()
            let signature = Array(signature)
            guard signature.count == Ed25519.signatureLength else { return false }
            return crypto_sign_verify_detached(signature, message, UInt64(message.count), bytes) == 0
        }
    }

    /// A signing key pair; the secret (libsodium's 64-byte form) in secure memory.
    public struct KeyPair: Sendable {
        let secret: SecureBytes
        public let publicKey: PublicKey

        public static func generate() -> KeyPair { try! KeyPair(seed: SecureBytes.random(count: seedLength)) }

        /// The pair a 32-byte seed (what a fleet key file holds) determines.
        public init(seed: SecureBytes) throws(CryptoError) {
            guard seed.count == seedLength else { throw .invalidLength(expected: seedLength, actual: seed.count) }
            requireSodium()
            let secret = SecureBytes(count: Int(crypto_sign_secretkeybytes()))
            var pub = [UInt8](repeating: 0, count: publicKeyLength)
            secret.withUnsafeMutableBytes { sk in
                seed.withUnsafeBytes { s in
                    _ = pub.withUnsafeMutableBytes { crypto_sign_seed_keypair($0.baseAddress!, sk.baseAddress!, s.baseAddress!) }
                }
            }
            self.secret = secret
            publicKey = try PublicKey(pub)
        }

        /// The seed back, for the key file.
        public var seed: SecureBytes { secret.prefix(Ed25519.seedLength) }

        public func sign(_ message: [UInt8]) -> [UInt8] {
            var signature = [UInt8](repeating: 0, count: signatureLength)
            secret.withUnsafeBytes { sk in
                _ = signature.withUnsafeMutableBytes { crypto_sign_detached($0.baseAddress!, nil, message, UInt64(message.count), sk.baseAddress!) }
            }
            return signature
        }
    }
}
