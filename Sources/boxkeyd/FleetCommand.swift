import ArgumentParser
import BoxkeyCore
import BoxkeyDaemon
import BoxkeyHost
import FoundationEssentials
import Glibc

/// `boxkeyd fleet …`: the fleet directory's phones, straight from the directory (the daemon
/// need not run): the `[fleet]` section says where; an admin binds as themself.
struct Fleet: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Enrol, revoke and list phones in the fleet directory ([fleet] in the configuration; docs/fleet.md).",
        discussion: "Every box of the fleet takes a phone enrolled here within its [fleet] refresh_s, and refuses a revoked one within the same. These commands bind as --bind-dn (default: the boxes' service account, [fleet] bind_dn) with the password in --password-file.",
        subcommands: [Phones.self, Enrol.self, Revoke.self, Check.self, Key.self, Certify.self, InstallCertificate.self, RevokeBox.self])

    struct Binding: ParsableArguments {
        @OptionGroup var options: DaemonOptions
        @Option(help: "Bind as this DN (an admin's; default: [fleet] bind_dn).") var bindDN: String?
        @Option(help: "The bind password's file (first line; mode 600).") var passwordFile: String?

        func directory() throws -> FleetDirectory {
            let config = try options.load()
            guard let fleet = config.fleet else {
                Console.error("boxkeyd: no [fleet] section in \(options.config) (docs/fleet.md)\n")
                throw ExitCode(78)
            }
            return FleetDirectory(settings: fleet, bindDN: bindDN, passwordFile: passwordFile)
        }
    }

    /// Runs a directory call; its failure is a clear line and exit status 1.
    static func run<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch {
            Console.error("boxkeyd: \(error)\n")
            throw ExitCode(1)
        }
    }

    struct Phones: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List a user's phones in the directory.")
        @OptionGroup var binding: Binding
        @Argument(help: "The user.") var user: String
        func run() throws {
            let directory = try binding.directory()
            guard let entry = try Fleet.run({ try directory.entry(of: user) }) else {
                Console.error("boxkeyd: no entry for \(user) under \(directory.settings.base)\n")
                throw ExitCode(1)
            }
            if entry.phones.isEmpty { print("\(user) has no phones in the directory") }
            for value in entry.phones {
                if let (key, name) = FleetRoster.parse(value) {
                    print("\(key.fingerprint)  \(hex(key.bytes))  \(name.isEmpty ? "-" : logSafe(name))")
                } else {
                    print("(not a phone key: \(logSafe(value)))")
                }
            }
        }
    }

    struct Enrol: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Enrol a phone for a user on every box of the fleet, by its public key (`boxkey status` on the phone shows it).")
        @OptionGroup var binding: Binding
        @Argument(help: "The phone's public key, 64 hex digits.") var key: String
        @Option(help: "The user the phone may log in as.") var user: String
        @Option(help: "A name for the phone.") var name = ""
        func run() throws {
            guard let bytes = unhex(key.lowercased()), let phone = try? PublicKey(bytes) else {
                throw ValidationError("a phone key is 64 hex digits (boxkey status shows it)")
            }
            let directory = try binding.directory()
            try Fleet.run { try directory.add(key: phone, name: name, user: user) }
            print("enrolled \(phone.fingerprint) for \(user) in the directory; every box takes it within [fleet] refresh_s (\(directory.settings.refresh.components.seconds) s)")
        }
    }

    struct Revoke: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove a phone of a user from the directory: every box refuses it within [fleet] refresh_s.")
        @OptionGroup var binding: Binding
        @Argument(help: "The phone's fingerprint (or a unique prefix of it, or of its key).") var fingerprint: String
        @Option(help: "The user whose phone it is.") var user: String
        func run() throws {
            let directory = try binding.directory()
            let removed = try Fleet.run { try directory.remove(phone: fingerprint, user: user) }
            for value in removed {
                let shown = FleetRoster.parse(value).map { $0.key.fingerprint } ?? value
                print("revoked \(shown) for \(user) in the directory; every box refuses it within [fleet] refresh_s (\(directory.settings.refresh.components.seconds) s)")
            }
        }
    }

    struct Check: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Read the whole roster as a box does, and say what it found and how long it took.")
        @OptionGroup var binding: Binding
        func run() throws {
            let directory = try binding.directory()
            let started = ContinuousClock.now
            let (roster, requests, skipped) = try Fleet.run { try directory.readRoster() }
            let took = ContinuousClock.now - started
            let users = Set(roster.phones.values.flatMap(\.users)).count
            print("\(directory.settings.uri): \(roster.phones.count) phone(s) of \(users) user(s) in \(took.components.seconds * 1000 + took.components.attoseconds / 1_000_000_000_000_000) ms, \(requests) request(s)\(skipped > 0 ? "; \(skipped) value(s) are not phone keys" : "")")
        }
    }
}

// MARK: - Box certificates

/// The fleet key file: the Ed25519 seed in 64 hex digits on one line, mode 600. It belongs on
/// an admin's machine, not on the boxes.
enum FleetKeyFile {
    static func read(_ path: String) throws -> Ed25519.KeyPair {
        var st = stat()
        guard lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { throw ValidationError("cannot read the fleet key \(path) (a regular file)") }
        guard st.st_uid == geteuid(), st.st_mode & 0o077 == 0 else { throw ValidationError("the fleet key \(path) must be yours and mode 600") }
        guard var bytes = try? PrivateFiles.read(path) else { throw ValidationError("cannot read the fleet key \(path)") }
        defer { secureZero(&bytes) }
        var digits = Array(bytes.prefix { $0 != 0x0a })
        defer { secureZero(&digits) }
        guard digits.count == 2 * Ed25519.seedLength, var seed = unhex(String(decoding: digits, as: UTF8.self)) else {
            throw ValidationError("\(path) is not a fleet key (64 hex digits)")
        }
        defer { secureZero(&seed) }
        return try! Ed25519.KeyPair(seed: SecureBytes(copying: seed))
    }

    /// Writes a new key file: created exclusively (never over an existing one), mode 600.
    static func create(_ path: String, _ key: Ed25519.KeyPair) throws {
        var text = Array(hex(key.seed.withUnsafeBytes { Array($0) }).utf8) + [0x0a]
        defer { secureZero(&text) }
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw ValidationError("cannot create \(path): \(String(cString: strerror(errno))) (a fleet key is never overwritten)") }
        defer { close(fd) }
        guard write(fd, text, text.count) == text.count, fsync(fd) == 0 else { throw ValidationError("cannot write \(path): \(String(cString: strerror(errno)))") }
    }
}

extension Fleet {
    struct Key: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create the fleet key, which certifies boxes; print its public half for phones (`boxkey fleet trust`).",
            discussion: "Keep the key file on an admin's machine, not on the boxes: whoever holds it can make a box every phone of the fleet trusts.")
        @Option(help: "Where to write the new key (mode 600; never overwritten).") var out: String
        func run() throws {
            let key = Ed25519.KeyPair.generate()
            try FleetKeyFile.create(out, key)
            print("fleet key \(key.publicKey.fingerprint) written to \(out)\npublic key (for `boxkey fleet trust` on phones): \(hex(key.publicKey.bytes))")
        }
    }

    struct Certify: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Certify a box: sign its key and ID with the fleet key; prints the certificate for `boxkeyd fleet install-certificate` on the box.")
        @Option(help: "The fleet key file.") var fleetKey: String
        @Option(help: "The box's public key, 64 hex digits (`boxkeyd status` on the box).") var boxKey: String
        @Option(help: "The box ID.") var boxID: String
        @Option(help: "Days the certificate is valid.") var days = 365
        func run() throws {
            guard let bytes = unhex(boxKey.lowercased()), let key = try? PublicKey(bytes) else { throw ValidationError("a box key is 64 hex digits") }
            guard let id = BoxID(boxID) else { throw ValidationError("a box ID is four digits") }
            guard (1...3650).contains(days) else { throw ValidationError("--days must be 1 to 3650") }
            let fleet = try FleetKeyFile.read(fleetKey)
            let now = Int64(Date().timeIntervalSince1970)
            let cert = BoxCertificate.issue(boxKey: key, boxID: id, serial: UInt64.random(in: 1...UInt64.max), notBefore: now - 60,
                                            notAfter: now + Int64(days) * 86_400, by: fleet)
            print(base64Encode(cert.encode()))
        }
    }

    struct InstallCertificate: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "install-certificate",
            abstract: "On the box: keep the certificate `boxkeyd fleet certify` printed; the box serves it from its next read of the directory.")
        @OptionGroup var options: DaemonOptions
        @Argument(help: "The certificate (base64).") var certificate: String
        func run() throws {
            let config = try options.load()
            guard let bytes = base64Decode(certificate), let cert = try? BoxCertificate.decode(bytes) else {
                throw ValidationError("that is not a box certificate")
            }
            let identity = try Fleet.run { try BoxIdentity.load(path: config.stateDirectory + "/identity") }
            guard cert.boxKey == identity.keyPair.publicKey else {
                throw ValidationError("the certificate is for key \(cert.boxKey.fingerprint), not this box's (\(identity.fingerprint))")
            }
            guard cert.boxID == (config.boxID ?? identity.boxID) else {
                throw ValidationError("the certificate is for box \(cert.boxID), and this is box \(config.boxID ?? identity.boxID)")
            }
            try Fleet.run { try PrivateFiles.write(Array((base64Encode(bytes) + "\n").utf8), to: config.stateDirectory + "/fleet-certificate") }
            print("installed certificate \(String(cert.serial, radix: 16)) for box \(cert.boxID), valid until \(Date(timeIntervalSince1970: Double(cert.notAfter)).ISO8601Format())")
        }
    }

    struct RevokeBox: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "revoke-box",
            abstract: "Revoke a box certificate: sign a new revocation list that names it, and write it to the directory ([fleet] revocations_dn).",
            discussion: "Phones refuse the box once they have seen the new list (at any box of the fleet) or once the list the box serves has expired. Without a serial, signs the current list again with a new expiry: do that before --days run out. The list holds at most 32 serials: --remove takes out one whose certificate has expired since.")
        @OptionGroup var binding: Binding
        @Option(help: "The fleet key file.") var fleetKey: String
        @Argument(help: "The certificate's serial (hex; `boxkeyd status` on the box shows it).") var serial: String?
        @Option(help: "Take this serial (hex) off the list: its certificate has expired.") var remove: String?
        @Option(help: "Days until the list must be signed again; phones refuse every certified box after that.") var days = 30
        func run() throws {
            guard (1...365).contains(days) else { throw ValidationError("--days must be 1 to 365") }
            func parse(_ s: String?) throws -> UInt64? {
                try s.map { s in
                    guard let n = UInt64(s, radix: 16) else { throw ValidationError("a serial is hex digits") }
                    return n
                }
            }
            let add = try parse(serial), drop = try parse(remove)
            let fleet = try FleetKeyFile.read(fleetKey)
            let directory = try binding.directory()
            let now = Int64(Date().timeIntervalSince1970)
            let list = try Fleet.run {
                try directory.updateRevocations { current in
                    // The next list is built only on one this fleet key signed: a value someone
                    // else wrote (un-revoking a box, or a number at the end of the range) is refused.
                    if let current {
                        guard current.isSigned(by: fleet.publicKey) else {
                            throw FleetDirectory.Failure(description: "the list in the directory is not signed by this fleet key: someone else wrote it, or this is another fleet's key; nothing was written")
                        }
                        guard current.number < UInt64(1) << 62 else {
                            throw FleetDirectory.Failure(description: "the list in the directory has number \(current.number), beyond any this tool makes; nothing was written")
                        }
                    }
                    var serials = current?.serials ?? []
                    if let drop { serials.removeAll { $0 == drop } }
                    if let add, !serials.contains(add) { serials.append(add) }
                    guard serials.count <= BoxRevocationList.maxSerials else {
                        throw FleetDirectory.Failure(description: "the list is full (\(BoxRevocationList.maxSerials) serials): take out one whose certificate has expired (--remove SERIAL), then revoke")
                    }
                    return try BoxRevocationList.issue(number: (current?.number ?? 0) + 1, issued: now, nextUpdate: now + Int64(days) * 86_400,
                                                       serials: serials, by: fleet)
                }
            }
            print("revocation list \(list.number): \(list.serials.count) certificate(s) revoked, valid until \(Date(timeIntervalSince1970: Double(list.nextUpdate)).ISO8601Format())")
            if list.serials.count >= BoxRevocationList.maxSerials - 4 {
                print("warning: the list holds \(list.serials.count) of at most \(BoxRevocationList.maxSerials) serials; take out those whose certificates have expired (--remove)")
            }
        }
    }
}
