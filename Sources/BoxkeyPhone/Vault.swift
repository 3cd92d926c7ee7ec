import BoxkeyCore
import Foundation

/// The phone's credential vault: user and password sealed with XChaCha20-Poly1305 in
/// `$XDG_DATA_HOME/boxkey/vault` (0600).
///
/// - Key: with a PIN, Argon2id(PIN, salt) at `Argon2id.Parameters.vault` (256 MiB, 3 passes),
///   then keyed BLAKE2b with the device secret, so the vault file alone (a backup, a copy) is
///   useless without this device's `phone.key`. Without a PIN, the device secret alone.
/// - Wrong PINs are counted in the file, under a MAC keyed by the device secret: an edited
///   counter is reported as tampering, never silently accepted. Delays after wrong PINs follow
///   iOS: 1 min at the 5th, 5 min at the 6th, 15 min at the 7th and 8th, 1 h at the 9th; the
///   10th wipes the credentials.
/// - Rolling the whole file back to an older copy cannot be detected without tamper-proof
///   storage; it still costs the attacker one Argon2id derivation per guess
///   (docs/threat-model.md).
public struct Vault {
    public static let maxFailures = 10

    public enum Failure: Error, Equatable, CustomStringConvertible {
        case noCredentials
        case pinRequired
        case wrongPIN(remaining: Int)
        case lockedOut(until: Date, failures: Int)
        case wiped
        case tampered(String)

        public var description: String {
            switch self {
            case .noCredentials: "no credentials stored: run `boxkey credentials set`"
            case .pinRequired: "the vault is protected by a PIN"
            case .wrongPIN(let n): "wrong PIN; \(n) attempt\(n == 1 ? "" : "s") left before the credentials are wiped"
            case .lockedOut(let until, let f): "\(f) wrong PINs: try again after \(ISO8601DateFormatter().string(from: until))"
            case .wiped: "the credentials were wiped after \(Vault.maxFailures) wrong PINs: store them again with `boxkey credentials set`"
            case .tampered(let why): "the vault file was modified outside boxkey (\(why)); refusing to use it"
            }
        }
    }

    /// Seconds to wait after `failures` wrong PINs before the next attempt.
    public static func delay(afterFailures failures: Int) -> TimeInterval {
        switch failures {
        case ..<5: 0
        case 5: 60
        case 6: 300
        case 7, 8: 900
        default: 3600
        }
    }

    struct PINParameters: Codable, Equatable {
        var salt: String
        var operations: UInt64
        var memory: Int
    }

    struct File: Codable, Equatable {
        var version = 1
        var pin: PINParameters?
        var nonce: String?
        var ciphertext: String?
        var failures = 0
        var lastFailure: Double?
        var wiped = false
        var mac = ""
    }

    private var file: File
    let path: String
    let deviceSecret: SecureBytes

    public var hasCredentials: Bool { file.ciphertext != nil }
    public var hasPIN: Bool { file.pin != nil }
    public var failures: Int { file.failures }
    public var isWiped: Bool { file.wiped }

    public static func load(_ dirs: PhoneDirectories, identity: PhoneIdentity) throws -> Vault {
        try dirs.ensure()
        let path = dirs.data + "/vault"
        var vault = Vault(file: File(), path: path, deviceSecret: identity.deviceSecret)
        guard FileManager.default.fileExists(atPath: path) else { return vault }
        guard let data = FileManager.default.contents(atPath: path) else { throw Failure.tampered("cannot read \(path)") }
        guard let file = try? JSONDecoder().decode(File.self, from: data) else { throw Failure.tampered("not a vault file") }
        vault.file = file
        guard file.version == 1 else { throw Failure.tampered("unknown version \(file.version)") }
        guard constantTimeEqualHex(file.mac, vault.mac(of: file)) else { throw Failure.tampered("its integrity check failed") }
        return vault
    }

    private init(file: File, path: String, deviceSecret: SecureBytes) {
        self.file = file
        self.path = path
        self.deviceSecret = deviceSecret
    }

    /// The stored credentials. With a PIN, a wrong one is counted (durably) before this throws.
    public mutating func credentials(pin: SecureBytes?, now: Date) throws -> (user: String, password: SecureBytes) {
        try checkAttemptAllowed(now: now)
        guard let nonce = file.nonce.flatMap(unhex), let ciphertext = file.ciphertext.flatMap(unhex) else { throw Failure.noCredentials }
        let key = try key(pin: pin)
        do {
            let plaintext = try XChaChaPoly.open(key: key, nonce: nonce, ad: associatedData(), ciphertext: ciphertext)
            if file.failures > 0 { file.failures = 0; file.lastFailure = nil; try save() }
            return try Self.decode(plaintext)
        } catch let f as Failure {
            throw f
        } catch {
            guard file.pin != nil else { throw Failure.tampered("the sealed credentials do not open") }
            try recordFailure(now: now)
        }
    }

    /// Checks a PIN without opening credentials (for `pin change` and `pin clear`).
    public mutating func verify(pin: SecureBytes?, now: Date) throws {
        if file.ciphertext != nil { _ = try credentials(pin: pin, now: now); return }
        if file.pin != nil { throw Failure.noCredentials }
    }

    public mutating func store(user: String, password: SecureBytes, pin: SecureBytes?) throws {
        // A fresh salt with every new PIN or new credentials.
        file.pin = pin == nil ? nil : PINParameters(salt: hex(SystemRandom.bytes(Argon2id.saltLength)),
                                                    operations: Argon2id.Parameters.vault.operations,
                                                    memory: Argon2id.Parameters.vault.memory)
        let key = try key(pin: pin)
        let nonce = SystemRandom.bytes(XChaChaPoly.nonceLength)
        file.nonce = hex(nonce)
        file.ciphertext = hex(XChaChaPoly.seal(key: key, nonce: nonce, ad: associatedData(), plaintext: Self.encode(user: user, password: password)))
        file.failures = 0
        file.lastFailure = nil
        file.wiped = false
        try save()
    }

    public mutating func clear() throws {
        file = File()
        try save()
    }

    // MARK: - Internals

    private func checkAttemptAllowed(now: Date) throws {
        if file.wiped { throw Failure.wiped }
        let wait = Self.delay(afterFailures: file.failures)
        if wait > 0, let last = file.lastFailure, now.timeIntervalSince1970 < last + wait {
            throw Failure.lockedOut(until: Date(timeIntervalSince1970: last + wait), failures: file.failures)
        }
    }

    private mutating func recordFailure(now: Date) throws -> Never {
        file.failures += 1
        file.lastFailure = now.timeIntervalSince1970
        if file.failures >= Self.maxFailures {
            file.nonce = nil
            file.ciphertext = nil
            file.wiped = true
            try save()
            throw Failure.wiped
        }
        try save()
        throw Failure.wrongPIN(remaining: Self.maxFailures - file.failures)
    }

    private func key(pin: SecureBytes?) throws -> SecureBytes {
        guard let parameters = file.pin else {
            return Blake2b.mac(key: deviceSecret, secret: SecureBytes(utf8: "boxkey vault key, no PIN"))
        }
        guard let pin else { throw Failure.pinRequired }
        guard let salt = unhex(parameters.salt), parameters.memory >= Argon2id.Parameters.vault.memory,
              parameters.operations >= Argon2id.Parameters.vault.operations else {
            throw Failure.tampered("weakened key-derivation parameters")
        }
        let stretched = try Argon2id.deriveKey(secret: pin, salt: salt, parameters: .init(operations: parameters.operations, memory: parameters.memory))
        return Blake2b.mac(key: deviceSecret, secret: stretched)
    }

    /// The KDF parameters are bound to the ciphertext, so they cannot be weakened in place.
    private func associatedData() -> [UInt8] {
        Array("boxkey vault 1".utf8) + Array((file.pin.map { "\($0.salt)/\($0.operations)/\($0.memory)" } ?? "no PIN").utf8)
    }

    private func mac(of f: File) -> String {
        var copy = f
        copy.mac = ""
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let bytes = (try? encoder.encode(copy)).map { [UInt8]($0) } ?? []
        return hex(Blake2b.mac(key: Blake2b.mac(key: deviceSecret, secret: SecureBytes(utf8: "boxkey vault mac")), bytes))
    }

    private mutating func save() throws {
        file.mac = mac(of: file)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try writePrivate(path, try encoder.encode(file))
    }

    static func encode(user: String, password: SecureBytes) -> SecureBytes {
        let u = Array(user.utf8.prefix(255))
        return SecureBytes(count: 1 + u.count + 2 + password.count) { o in
            o[0] = UInt8(u.count)
            for (i, b) in u.enumerated() { o[1 + i] = b }
            o[1 + u.count] = UInt8(password.count >> 8)
            o[2 + u.count] = UInt8(password.count & 0xff)
            password.withUnsafeBytes { p in
                UnsafeMutableRawBufferPointer(rebasing: o[(3 + u.count)...]).copyMemory(from: p)
            }
        }
    }

    static func decode(_ plaintext: SecureBytes) throws -> (user: String, password: SecureBytes) {
        try plaintext.withUnsafeBytes { p in
            guard p.count >= 3 else { throw Failure.tampered("short plaintext") }
            let u = Int(p[0])
            guard p.count >= 3 + u else { throw Failure.tampered("short plaintext") }
            let user = String(decoding: p[1..<(1 + u)], as: UTF8.self)
            let n = Int(p[1 + u]) << 8 | Int(p[2 + u])
            guard p.count == 3 + u + n else { throw Failure.tampered("bad plaintext length") }
            return (user, SecureBytes(copying: UnsafeRawBufferPointer(rebasing: p[(3 + u)...])))
        }
    }
}

private func constantTimeEqualHex(_ a: String, _ b: String) -> Bool {
    let x = Array(a.utf8), y = Array(b.utf8)
    return x.withUnsafeBytes { xa in y.withUnsafeBytes { ya in constantTimeEqual(xa, ya) } }
}

/// The time the vault's delays are measured in. `BOXKEY_TEST_NOW` (seconds since 1970) lets
/// the end-to-end tests move through an hour of delays in a second; it weakens nothing,
/// because the delays are a courtesy of this program — the Argon2id cost per guess is what an
/// attacker with the file faces.
public func vaultNow() -> Date {
    if let s = ProcessInfo.processInfo.environment["BOXKEY_TEST_NOW"], let t = Double(s) { return Date(timeIntervalSince1970: t) }
    return Date()
}
