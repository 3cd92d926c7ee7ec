import ArgumentParser
import BoxkeyCore
import BoxkeyDaemon
import BoxkeyHost
import FoundationEssentials

/// `boxkeyd fleet …`: the fleet directory's phones, straight from the directory (the daemon
/// need not run): the `[fleet]` section says where; an admin binds as themself.
struct Fleet: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Enrol, revoke and list phones in the fleet directory ([fleet] in the configuration; docs/fleet.md).",
        discussion: "Every box of the fleet takes a phone enrolled here within its [fleet] refresh_s, and refuses a revoked one within the same. These commands bind as --bind-dn (default: the boxes' service account, [fleet] bind_dn) with the password in --password-file.",
        subcommands: [Phones.self, Enrol.self, Revoke.self, Check.self])

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
