import ArgumentParser
import BoxkeyCore
import BoxkeyL10n
import BoxkeyPhone

/// `boxkey`: the phone, on the command line. Each command lives in its own file and only
/// parses, asks and prints; what a phone does is in BoxkeyPhone.
@main
struct Boxkey: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "boxkey",
        abstract: "Log into a Boxkey box from this device over Bluetooth LE.",
        discussion: """
        Pair once (boxkey pair 4821, with the code the box shows), store your credentials once \
        (boxkey credentials set), then log in with one command (boxkey login). With an agent \
        running (boxkey agent start), the vault is opened once and each login is one step.

        State: $XDG_CONFIG_HOME/boxkey (the phone key, pinned boxes), $XDG_DATA_HOME/boxkey/vault \
        (credentials, sealed; PIN of at least 6 digits), $XDG_RUNTIME_DIR/boxkey/agent.sock (the \
        agent), $XDG_STATE_HOME/boxkey/agent.log.

        Exit codes:
        \(Outcome.allCases.map { "  \((String($0.rawValue) + "   ").prefix(3)) \($0.summary)" }.joined(separator: "\n"))
        """,
        version: "boxkey \(BoxkeyRelease.description)",
        subcommands: [Scan.self, Pair.self, Forget.self, Credentials.self, PIN.self, Login.self, Lock.self, Logout.self,
                      Status.self, Doctor.self, Agent.self, Fleet.self, Sim.self])

    /// The reader's language for what boxkey says (LANGUAGE, LC_ALL, LC_MESSAGES, LANG); the
    /// help text stays English.
    static func main() async {
        Translator.useEnvironmentLocale()
        do {
            var command = try parseAsRoot()
            if var async = command as? AsyncParsableCommand { try await async.run() } else { try command.run() }
        } catch {
            exit(withError: error)
        }
    }
}

extension BoxID: ExpressibleByArgument {
    public init?(argument: String) {
        guard argument.count == 4 else { return nil }
        self.init(argument)
    }

    public static var defaultCompletionKind: CompletionKind { .default }
}
