import ArgumentParser
import BoxkeyCore
import BoxkeyDaemon
import BoxkeyPAMWire
import BoxkeyHost
import BoxkeyTransports
import FoundationEssentials
import Glibc
import Logging

/// The program starts on executors that let an idle daemon sleep (QuietExecutors).
@main
enum Main {
    static func main() {
        QuietExecutors.run { await Boxkeyd.main() }
    }
}

/// boxkeyd: the Boxkey box daemon.
struct Boxkeyd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "boxkeyd",
        abstract: "The Boxkey box daemon: advertises this box over Bluetooth LE, receives phones' encrypted credentials and hands them to PAM, and locks the session when the phone walks away.",
        discussion: "Configuration: /etc/boxkey/boxkeyd.conf (TOML; boxkeyd.conf(5) documents every key). Admin commands talk to the running daemon over its root-only socket. SIGHUP re-reads the configuration (boxkeyd(8)).\n\nExit status: 0 success; 1 failure (the daemon could not start, or refused the request; doctor: a check failed); 64 bad arguments; 69 the daemon is not answering; 78 the configuration file is invalid, or a state file is not the daemon's own, is writable by others, or is corrupt.",
        version: "boxkeyd \(BoxkeyRelease.description)",
        subcommands: [Run.self, Status.self, Reload.self, PairCode.self, Phones.self, Fleet.self, Doctor.self],
        defaultSubcommand: Run.self)
}

struct DaemonOptions: ParsableArguments {
    @Option(name: .long, help: "Configuration file.")
    var config = "/etc/boxkey/boxkeyd.conf"

    @Option(name: .long, help: "Override [pam] socket: the daemon's PAM socket (its admin socket is beside it: admin.sock for pam.sock).")
    var socket: String?

    /// The configuration; an invalid file is said on standard error and exits 78 (EX_CONFIG).
    func load() throws -> DaemonConfig {
        var c: DaemonConfig
        do { c = try DaemonConfig.load(path: config) } catch {
            // Under systemd, standard error is the journal: "<3>" makes the line an error there
            // (it was info, hidden by `journalctl -p warning`, boxkeyd(8)'s advice).
            let level = ProcessInfo.processInfo.environment["JOURNAL_STREAM"] == nil ? "" : "<3>"
            Console.error("\(level)boxkeyd: \(error)\n")
            throw ExitCode(78)   // EX_CONFIG
        }
        if let socket { c.pamSocket = socket }
        return c
    }

    /// Whether the file exists: a missing one means every default, which the daemon says.
    var fileExists: Bool { FileManager.default.fileExists(atPath: config) }
}

extension Boxkeyd {
    struct Run: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Run the daemon (the default; systemd starts it so).")

        @OptionGroup var options: DaemonOptions

        @Flag(name: .long, help: "Check the configuration file and exit: 0 if it is valid.")
        var checkConfig = false

        @Option(name: .long, help: "Radio: auto, simulated or bluez (overrides [radio] backend).")
        var radio: String?

        @Option(name: .long, help: "BlueZ adapter, e.g. hci0 (overrides [radio] adapter).")
        var adapter: String?

        @Option(name: .long, help: "State directory (overrides [box] state_directory).")
        var stateDirectory: String?

        @Option(name: .long, help: "Box ID, four digits (overrides [box] id).")
        var boxID: String?

        @Option(name: .long, help: "Log level: trace, debug, info, notice, warning, error, critical.")
        var logLevel = "info"

        func validate() throws {
            guard Logger.Level(rawValue: logLevel) != nil else {
                throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
            }
        }

        func run() async throws {
            var config = try options.load()
            if let radio {
                guard let r = DaemonConfig.RadioBackend(rawValue: radio) else { throw ValidationError("--radio must be auto, simulated or bluez") }
                config.radio = r
            }
            if let adapter { config.adapter = adapter }
            if let stateDirectory { config.stateDirectory = stateDirectory }
            if let boxID {
                guard let id = BoxID(boxID) else { throw ValidationError("--box-id must be four digits") }
                config.boxID = id
            }
            if checkConfig {
                for warning in config.warnings { Console.error("boxkeyd: warning: \(warning)\n") }
                let dropIns = DaemonConfig.dropIns(of: options.config)
                let with = dropIns.isEmpty ? "" : " (with \(dropIns.joined(separator: ", ")))"
                print(options.fileExists ? "\(options.config)\(with): OK"
                      : dropIns.isEmpty ? "\(options.config): no such file; every setting has its default"
                      : "\(options.config): no such file; the drop-ins\(with) are OK, every other setting has its default")
                return
            }
            let level = Logger.Level(rawValue: logLevel)!  // checked in validate()
            LoggingSystem.bootstrap { label in DaemonLogHandler(label: label, level: level) }
            let logger = Logger(label: "boxkeyd")
            for warning in config.warnings { logger.warning("\(warning)") }
            if !options.fileExists {
                logger.notice("no configuration file at \(options.config): every setting has its default (docs/operations.md lists them)")
            }
            do {
                // SIGHUP re-reads the file; the options given here override only keys that a
                // reload keeps as they are anyway.
                let path = options.config
                try await Daemon.run(config: config, radios: BoxRadios(), logger: logger, reload: { try DaemonConfig.load(path: path, missingIsError: true) })
            } catch let error as Daemon.StartError {
                logger.critical("cannot start: \(error.description)")
                throw ExitCode(error.exitCode)
            }
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show the box ID, key fingerprint, radio, pairing code state, enrolled phones and registered sessions.")
        @OptionGroup var options: DaemonOptions
        @Flag(help: "As a JSON object.") var json = false
        func run() throws {
            let answer = try ask(.daemonStatus, options)
            print(json ? answer : try AdminJSON.decode(DaemonStatus.self, answer).text)
        }
    }

    struct Reload: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Have the running daemon re-read its configuration file now, and say what changed.",
            discussion: "Exit status 1 when the file did not load (the running settings stay, and the error is printed). systemctl reload boxkeyd runs this.")
        @OptionGroup var options: DaemonOptions
        func run() throws {
            // A file that does not load is the daemon's to report (and to keep for status):
            // the socket is found from the defaults and --socket then.
            print(try ask(.reload, config: adminConfig(options, warn: false)))
        }
    }

    struct Doctor: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check what breaks a box in the field (configuration, D-Bus, bluetoothd and the adapter, logind, the daemon, its state, the PAM module and every phone-login stack) and say what to do.",
            discussion: "Each line is ok, warning or FAILED. Exit status 0 when nothing failed, 1 otherwise.")
        @OptionGroup var options: DaemonOptions
        @Flag(help: "As a JSON object.") var json = false
        func run() async throws {
            var config = DaemonConfig()
            var problem: String?
            do { config = try DaemonConfig.load(path: options.config) } catch { problem = "\(error)" }
            if let socket = options.socket { config.pamSocket = socket }
            // What boxes advertise nearby, heard on the box's own radio beside the daemon.
            let listener = await BoxRadios().listener(config)
            let listen: (@Sendable (Duration) async -> [Advertisement])? = listener.map { scanner in
                { @Sendable duration in await Daemon.nearbyAdvertisements(scanner, for: duration) }
            }
            let report = await BoxDoctor.run(config: config, configProblem: problem, configPath: options.config, listen: listen)
            print(report.output(json: json))
            if report.failed { throw ExitCode(1) }
        }
    }

    struct PairCode: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "pair-code",
            abstract: "Show a new one-time pairing code (for a headless box, or an admin enrolling a phone at the box).",
            discussion: "The code replaces any live one; it lasts [enrolment] code_lifetime_s (120 s) and code_tries (3) pairing attempts. Type it into `boxkey pair <box ID>` on the phone. With --user, the phone that proves it is enrolled for that user at once; without, its first accepted login enrols it.")
        @OptionGroup var options: DaemonOptions
        @Option(help: "Enrol the phone for this user when it pairs.") var user: String?
        func run() throws { print(try ask(.newPairingCode(user: user ?? ""), options)) }
    }

    struct Phones: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List, enrol or revoke the phones enrolled at this box.",
                                                        subcommands: [List.self, Enrol.self, Revoke.self], defaultSubcommand: List.self)
        struct List: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "List phones: fingerprint, users, name, how and when enrolled, last login, revocation.")
            @OptionGroup var options: DaemonOptions
            @Flag(help: "As a JSON array.") var json = false
            func run() throws {
                let answer = try ask(.listPhones, options)
                print(json ? answer : PhoneRegistry.text(try AdminJSON.decode([PhoneRegistry.Phone].self, answer)))
            }
        }
        struct Enrol: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Pre-enrol a phone for a user by its public key (`boxkey status` on the phone shows it); the phone then pins this box with `boxkey pair <ID> --box-key <key>`.")
            @OptionGroup var options: DaemonOptions
            @Argument(help: "The phone's public key, 64 hex digits.") var key: String
            @Option(help: "The user the phone may log in as.") var user: String
            @Option(help: "A name for the phone, for the list.") var name = ""
            func run() throws { print(try ask(.enrolPhone(key: key, user: user, name: name), options)) }
        }
        struct Revoke: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Revoke a phone: it is refused from now on and its live links are dropped.",
                                                            discussion: "Names the phone and asks before revoking; --yes skips the question (scripts).")
            @OptionGroup var options: DaemonOptions
            @Argument(help: "The phone's fingerprint, or a unique prefix of it (at least 4 hex digits).")
            var fingerprint: String
            @Flag(name: .shortAndLong, help: "Revoke without asking.") var yes = false
            func run() throws {
                guard fingerprint.filter({ $0 != "-" }).count >= 4 else {
                    Console.error("boxkeyd: give at least 4 hex digits of the fingerprint (boxkeyd phones list shows them)\n")
                    throw ExitCode(64)   // EX_USAGE
                }
                var named = fingerprint
                if !yes {
                    let phones = try AdminJSON.decode([PhoneRegistry.Phone].self, try ask(.listPhones, options))
                    let matches = phones.filter { Fingerprint.matches($0.fingerprint, prefix: fingerprint) }
                    // Several or none: the daemon says so (none may still be a fleet directory's phone).
                    let what = matches.count == 1
                        ? "phone \(matches[0].fingerprint) (\(matches[0].users.joined(separator: ", ")), \"\(matches[0].name)\")"
                        : "the fleet directory's phone \(fingerprint)"
                    if matches.count <= 1 {
                        guard isatty(0) != 0 else {
                            Console.error("boxkeyd: not revoking \(what): nobody at a terminal to confirm; add --yes\n")
                            throw ExitCode(1)
                        }
                        Console.out("Revoke \(what) at this box? Its links drop at once. [y/N] ")
                        guard let answer = readLine(), ["y", "yes"].contains(answer.trimmed.lowercased()) else {
                            print("not revoked")
                            throw ExitCode(1)
                        }
                        // Exactly the phone the question named, though the prefix may also
                        // match one of the fleet directory's.
                        if let phone = matches.first { named = phone.fingerprint }
                    }
                }
                print(try ask(.revokePhone(fingerprint: named), options))
            }
        }
    }
}

/// One request to the running daemon; returns its answer. A file that does not load does not
/// stop it: the running daemon keeps the settings it has, and a lost phone must be revocable
/// before the typo is fixed. The socket is then found from the file's `[pam] socket` line if it
/// can be read, else the default (or --socket), and the error is said.
func ask(_ request: AdminRequest, _ options: DaemonOptions) throws -> String {
    try ask(request, config: adminConfig(options))
}

/// `warn`: say the file's error (`reload` does not: the daemon answers with it).
func adminConfig(_ options: DaemonOptions, warn: Bool = true) -> DaemonConfig {
    var config = DaemonConfig()
    var problem: (any Error)?
    do { config = try DaemonConfig.load(path: options.config) } catch {
        problem = error
        if let socket = DaemonConfig.socketLine(in: options.config) { config.pamSocket = socket }
    }
    if let socket = options.socket { config.pamSocket = socket }
    if warn, let problem {
        Console.error("boxkeyd: warning: \(problem) (the running daemon keeps its settings; asking it on \(config.adminSocket))\n")
    }
    return config
}

func ask(_ request: AdminRequest, config: DaemonConfig) throws -> String {
    do {
        let client = try DaemonSocketClient(path: config.adminSocket)
        try client.send(request)
        switch try client.receiveAdmin(timeoutMilliseconds: 5000) {
        case .text(let t): return t
        case .error(let e):
            Console.error("boxkeyd: \(e)\n")
            throw ExitCode(1)
        }
    } catch DaemonSocketClient.Error.protocolError(let why) {
        // It answered, but not in words this command reads: another release's daemon, most likely.
        Console.error("boxkeyd: the daemon on \(config.adminSocket) answered in a form this command does not read (\(why)); is it the same release as this command?\n")
        throw ExitCode(76)   // EX_PROTOCOL
    } catch let e as DaemonSocketClient.Error {
        Console.error("boxkeyd: the daemon is not answering on \(config.adminSocket) (\(e)); is it running, and are you root?\n")
        throw ExitCode(69)   // EX_UNAVAILABLE
    }
}
