import BoxkeyCore
import BoxkeyHost
import FoundationEssentials
import Glibc

/// The phone's credential vault: user and password sealed with XChaCha20-Poly1305 in
/// `$XDG_DATA_HOME/boxkey/vault` (0600).
///
/// - Key: with a PIN, Argon2id(PIN, salt) at `Argon2id.Parameters.vault` (256 MiB, 3 passes),
///   then keyed BLAKE2b with the device secret, so the vault file alone (a backup, a copy) is
///   useless without this device's `phone.key`. Without a PIN, the device secret alone.
/// - Every PIN attempt is counted in the file — written and fsynced — *before* the key is
///   derived, and a correct PIN resets the count. An attempt whose count cannot be written (a
///   full disk, `RLIMIT_FSIZE=0`, a read-only home) gets no answer at all, and killing the
///   process during the derivation leaves the attempt counted. The counter is under a MAC
///   keyed by the device secret: an edited counter is reported as tampering, never silently
///   accepted. Delays after wrong PINs follow iOS: 1 min at the 5th, 5 min at the 6th, 15 min
///   at the 7th and 8th, 1 h at the 9th; the 10th wipes the credentials.
/// - A PIN is at least `minimumPINLength` digits; an empty entry, or one that cannot be a PIN,
///   is no attempt.
/// - Rolling the whole file back to an older copy cannot be detected without tamper-proof
///   storage; it still costs the attacker one Argon2id derivation per guess
///   (docs/threat-model.md). A vault that fails its checks is never opened; the recovery is
///   `boxkey credentials clear --force`, which removes the file and reveals nothing.
public struct Vault {
    public static let maxFailures = 10
    public static let minimumPINLength = 6

    /// Why `pin` cannot be a new PIN, or nil if it can.
    public static func problem(withNewPIN pin: SecureBytes) -> String? {
        let digitsOnly = pin.withUnsafeBytes { $0.allSatisfy { (0x30...0x39).contains($0) } }
        guard digitsOnly, pin.count >= minimumPINLength else { return "a PIN is at least \(minimumPINLength) digits (0-9)" }
        return nil
    }

    /// What the vault file holds, for `status`: it never throws, so a damaged vault can still
    /// be looked at and cleared.
    public enum State: Equatable, Sendable {
        case empty
        case stored(pin: Bool, failures: Int, lockedUntil: Date? = nil)
        case wiped
        case unusable(String)
    }

    public static func state(_ dirs: PhoneDirectories, identity: PhoneIdentity, now: Date = Date()) -> State {
        do {
            let vault = try load(dirs, identity: identity)
            if vault.isWiped { return .wiped }
            return vault.hasCredentials ? .stored(pin: vault.hasPIN, failures: vault.failures, lockedUntil: vault.lockedUntil(now: now)) : .empty
        } catch let f as Failure {
            if case .tampered(let why) = f { return .unusable(why) }
            return .unusable("\(f)")
        } catch {
            return .unusable("\(error)")
        }
    }

    /// Removes the vault file whatever it holds (`credentials clear --force`): the way out of a
    /// tampered or unreadable vault. Nothing in it is read.
    public static func remove(_ dirs: PhoneDirectories) throws {
        try PrivateFiles.remove(dirs.vault)
    }

    public enum Failure: Error, Equatable, CustomStringConvertible {
        case noCredentials
        case pinRequired
        case wrongPIN(remaining: Int)
        case lockedOut(until: Date, failures: Int)
        case wiped
        case tampered(String)
        /// Nothing was entered: no attempt was made or counted.
        case noPINEntered
        /// What was entered cannot be a PIN (a word, a "y" meant for another question): no
        /// attempt was made or counted.
        case notAPIN
        /// The attempt could not be counted on disk, so the PIN was not tried.
        case attemptNotRecorded(String)

        /// "4 min 12 s" from now (the vault's clock) until `date`.
        static func countdown(to date: Date) -> String {
            let seconds = max(0, Int(date.timeIntervalSince(vaultNow()).rounded(.up)))
            if seconds >= 3600 { return "\(seconds / 3600) h \(seconds % 3600 / 60) min" }
            return seconds >= 60 ? "\(seconds / 60) min \(seconds % 60) s" : "\(seconds) s"
        }

        public var description: String {
            switch self {
            case .noCredentials: tr("no credentials stored: run `boxkey credentials set`")
            case .pinRequired: tr("the vault is protected by a PIN")
            case .wrongPIN(let n): tr.plural("wrong PIN; {n} attempt left before the credentials are wiped", "wrong PIN; {n} attempts left before the credentials are wiped", n, ("n", n))
            case .lockedOut(let until, let f):
                tr("{n} wrong PINs: try again in {wait} (at {time}); {left} tries left before the credentials are wiped",
                   ("n", f), ("wait", Self.countdown(to: until)), ("time", localClockTime(until)), ("left", Vault.maxFailures - f))
            case .wiped: tr("the credentials were wiped after {n} wrong PINs: store them again with `boxkey credentials set`", ("n", Vault.maxFailures))
            case .tampered(let why): tr("the vault file was modified outside boxkey ({why}); refusing to use it. To start over, `boxkey credentials clear --force` removes it (nothing in it is revealed)", ("why", why))
            case .noPINEntered: tr("no PIN entered; nothing was tried")
            case .notAPIN: tr("that is not a PIN (a PIN is {n} or more digits, 0-9); nothing was tried", ("n", Vault.minimumPINLength))
            case .attemptNotRecorded(let why): tr("could not record the PIN attempt ({why}); the PIN was not tried", ("why", why))
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

    /// Until when wrong PINs lock the vault (no attempt is taken before), or nil. A failure
    /// dated in the future counts from `now`, as an attempt would.
    public func lockedUntil(now: Date) -> Date? {
        let wait = Self.delay(afterFailures: file.failures)
        guard file.pin != nil, !file.wiped, wait > 0, let last = file.lastFailure else { return nil }
        let until = min(last, now.timeIntervalSince1970) + wait
        return until > now.timeIntervalSince1970 ? Date(timeIntervalSince1970: until) : nil
    }

    /// The lockout as the failure a command ends with, if the vault is locked now.
    public func lockout(now: Date) -> Failure? {
        lockedUntil(now: now).map { Failure.lockedOut(until: $0, failures: file.failures) }
    }
    public var failures: Int { file.failures }
    public var isWiped: Bool { file.wiped }

    public static func load(_ dirs: PhoneDirectories, identity: PhoneIdentity) throws -> Vault {
        try dirs.ensure()
        var vault = Vault(file: File(), path: dirs.vault, deviceSecret: identity.deviceSecret)
        try vault.reload()
        return vault
    }

    /// Reads the file again (under the lock, the count another process may have moved).
    private mutating func reload() throws {
        // Unreadable is not tampered: the advice for tampering (clear --force) loses the vault.
        guard let bytes = try PrivateFiles.read(path) else { file = File(); return }
        guard let read = try? JSONDecoder().decode(File.self, from: Data(bytes)) else { throw Failure.tampered("not a vault file") }
        guard read.version == 1 else { throw Failure.tampered("unknown version \(read.version)") }
        guard constantTimeEqualHex(read.mac, mac(of: read)) else { throw Failure.tampered("its integrity check failed") }
        file = read
    }

    /// An exclusive `flock` on the vault's directory for one whole attempt — count,
    /// derivation, result — so attempts from several processes at once are counted one by one,
    /// each seeing the count and the delay the others left. The directory, not a lock file:
    /// a lock file can be unlinked between two attempts, and each would then hold a lock of
    /// its own (an attacker's review lost counts that way).
    private func lock() throws -> Int32 {
        let directory = path.parentDirectory
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw Failure.attemptNotRecorded("cannot open \(directory): \(String(cString: strerror(errno)))") }
        // Bounded: a stopped or hung process holding the lock must not hang this one (the
        // agent would stop answering forget and stop). Attempts take about half a second each.
        let deadline = Date().addingTimeInterval(Self.lockWait)
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let e = errno
            guard e == EINTR || e == EWOULDBLOCK, Date() < deadline else {
                close(fd)
                throw Failure.attemptNotRecorded(e == EWOULDBLOCK ? "another boxkey process holds the vault (\(directory)); try again" : "cannot lock \(directory)")
            }
            usleep(20_000)
        }
        return fd
    }

    /// How long an attempt waits for another process's attempt to finish.
    static let lockWait: TimeInterval = 30

    private init(file: File, path: String, deviceSecret: SecureBytes) {
        self.file = file
        self.path = path
        self.deviceSecret = deviceSecret
    }

    /// The stored credentials. With a PIN, the attempt is counted on disk first, then tried.
    public mutating func credentials(pin: SecureBytes?, now: Date) throws -> (user: String, password: SecureBytes) {
        let held = try lock()
        defer { close(held) }
        try reload()
        try checkNotWiped()
        guard let nonce = file.nonce.flatMap(unhex), let ciphertext = file.ciphertext.flatMap(unhex) else { throw Failure.noCredentials }
        if file.pin != nil {
            guard let pin else { throw Failure.pinRequired }
            guard pin.count > 0 else { throw Failure.noPINEntered }
            // Every PIN was set under `problem(withNewPIN:)`: anything else is not an attempt.
            guard Self.problem(withNewPIN: pin) == nil else { throw Failure.notAPIN }
            try checkNoDelay(now: now)
            try countAttempt(now: now)
        }
        let key = try key(pin: pin)
        do {
            let plaintext = try XChaChaPoly.open(key: key, nonce: nonce, ad: associatedData(), ciphertext: ciphertext)
            let credentials = try Self.decode(plaintext)
            if file.failures > 0 {
                file.failures = 0
                file.lastFailure = nil
                // The right PIN was given; if the reset cannot be written the count stays
                // higher than it should, which errs on the safe side.
                try? save()
            }
            return credentials
        } catch let f as Failure {
            throw f
        } catch {
            guard file.pin != nil else { throw Failure.tampered("the sealed credentials do not open") }
            try wrongPIN()
        }
    }

    /// Checks a PIN without opening credentials (for `pin change` and `pin clear`).
    public mutating func verify(pin: SecureBytes?, now: Date) throws {
        if file.ciphertext != nil { _ = try credentials(pin: pin, now: now); return }
        if file.pin != nil { throw Failure.noCredentials }
    }

    public mutating func store(user: String, password: SecureBytes, pin: SecureBytes?) throws {
        // A PIN outside the rule could never be entered again (`credentials` refuses it).
        if let pin, Self.problem(withNewPIN: pin) != nil { throw Failure.notAPIN }
        let held = try lock()
        defer { close(held) }
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
        let held = try lock()
        defer { close(held) }
        file = File()
        try save()
    }

    // MARK: - Internals

    /// A vault at the limit is wiped now, even if the process that made the last attempt died
    /// before it could wipe it.
    private mutating func checkNotWiped() throws {
        if file.wiped { throw Failure.wiped }
        if file.pin != nil, file.failures >= Self.maxFailures { try wipe() }
    }

    private mutating func checkNoDelay(now: Date) throws {
        let wait = Self.delay(afterFailures: file.failures)
        if wait > 0, var last = file.lastFailure {
            // A failure recorded in the future (a clock set back, or faked forward for an
            // earlier attempt) is moved to now, on disk: the owner waits the delay from now,
            // not until the faked time.
            if last > now.timeIntervalSince1970 {
                last = now.timeIntervalSince1970
                file.lastFailure = last
                do { try save() } catch { throw Failure.attemptNotRecorded("\(error)") }
            }
            guard now.timeIntervalSince1970 >= last + wait else {
                throw Failure.lockedOut(until: Date(timeIntervalSince1970: last + wait), failures: file.failures)
            }
        }
    }

    /// The attempt is on disk before the PIN is tried: no answer without the count.
    private mutating func countAttempt(now: Date) throws {
        file.failures += 1
        file.lastFailure = now.timeIntervalSince1970
        do { try save() } catch { throw Failure.attemptNotRecorded("\(error)") }
    }

    /// The attempt was already counted; at the limit the credentials go.
    private mutating func wrongPIN() throws -> Never {
        if file.failures >= Self.maxFailures { try wipe() }
        throw Failure.wrongPIN(remaining: Self.maxFailures - file.failures)
    }

    private mutating func wipe() throws -> Never {
        file.nonce = nil
        file.ciphertext = nil
        file.wiped = true
        try save()
        throw Failure.wiped
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
        try PrivateFiles.write(try encoder.encode(file), to: path)
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

/// The time the vault's delays are measured in. Debug builds (the tests) honour
/// `BOXKEY_TEST_NOW` (seconds since 1970) to move through an hour of delays in a second; release
/// builds, which are what ships, do not have it.
public func vaultNow() -> Date {
    #if BOXKEY_TEST_HOOKS
    if let s = ProcessInfo.processInfo.environment["BOXKEY_TEST_NOW"], let t = Double(s) { return Date(timeIntervalSince1970: t) }
    #endif
    return Date()
}
