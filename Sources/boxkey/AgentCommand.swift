import ArgumentParser
import BoxkeyCore
import BoxkeyHost
import BoxkeyPhone
import Dispatch
import FoundationEssentials
import Glibc

/// A lifetime such as 90s, 30m, 4h or 3600 (seconds).
struct Lifetime: ExpressibleByArgument {
    let duration: Duration
    let text: String
    init?(argument: String) {
        let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3600]
        var digits = Substring(argument)
        var unit: Int64 = 1
        if let last = argument.last, let u = units[last] { unit = u; digits = digits.dropLast() }
        guard let n = Int64(digits), n > 0, n <= 7 * 24 * 3600 / unit else { return nil }
        duration = .seconds(n * unit)
        text = argument
    }
    /// As written ("4h"), for the help's "(default: 4h)".
    var defaultValueDescription: String { text }
}

extension Boxkey {
    struct Agent: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Keep the credentials unlocked for a while and log in without the PIN (like ssh-agent).",
            discussion: "The agent opens the vault once and holds the credentials in locked memory until its lifetime ends, `boxkey lock`, a suspend, or `boxkey agent forget`. boxkey login then goes through it (no PIN, no vault read), and it keeps the presence link. Its socket is $XDG_RUNTIME_DIR/boxkey/agent.sock, reachable by this user only; its log is $XDG_STATE_HOME/boxkey/agent.log.",
            subcommands: [AgentCommand.Start.self, AgentCommand.Status.self, AgentCommand.Forget.self, AgentCommand.Stop.self],
            defaultSubcommand: AgentCommand.Status.self)
    }
}

enum AgentCommand {
    static let defaultLifetime = Lifetime(argument: "4h")!

    struct Start: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Start the agent: asks the PIN once, then runs in the background.")
        @Option(help: "How long the credentials are held: 90s, 30m, 4h (at most 7 days).") var lifetime = AgentCommand.defaultLifetime
        @Flag(help: "Stay in the foreground (for a systemd user unit); the log goes to standard output.") var foreground = false
        @Flag(help: "Proximity login: within 30 minutes of this PIN, when a paired box's prompt waits and the box is near, offer the login there; it happens only when someone presses Enter at that prompt (the box must allow it: [login] proximity).")
        var proximity = false
        @Flag(help: .hidden) var detachedChild = false
        @OptionGroup var radio: RadioOptions

        func run() async throws {
            try await Terminal.run {
                let phone = try Phone.open()
                if let client = AgentClient(phone.dirs), case .result(.success, _, let details) = try client.send(.status),
                   let status = try? JSONDecoder().decode(AgentStatus.self, from: Data(details.utf8)) {
                    Terminal.say(tr("An agent is already running (pid {pid}).", ("pid", status.pid)))
                    return
                }
                if !foreground, !detachedChild {
                    try Self.spawnAgent(phone: phone, radio: radio, lifetime: lifetime, proximity: proximity)
                    return
                }
                try await serve(phone)
            }
        }

        /// Asks the PIN here, then starts `agent start --detached-child` in its own session
        /// with the PIN on its standard input; returns once it serves.
        static func spawnAgent(phone: Phone, radio: RadioOptions, lifetime: Lifetime, proximity: Bool = false) throws {
            let vault = try phone.vault()
            if vault.isWiped { throw Vault.Failure.wiped.asPhoneFailure }
            guard vault.hasCredentials else { throw Vault.Failure.noCredentials.asPhoneFailure }
            // Locked by wrong PINs: said before the PIN is asked, not after.
            if let lockout = vault.lockout(now: vaultNow()) { throw lockout.asPhoneFailure }
            let pin = vault.hasPIN ? try Terminal.readPIN() : nil
            let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
            let status = Detached.spawn([executable, "agent", "start", "--detached-child", "--lifetime", lifetime.text] + (proximity ? ["--proximity"] : []) + radio.arguments,
                                        input: pin, ready: "Agent running")
            guard status == 0 else { throw ExitCode(status) }
        }

        private func serve(_ phone: Phone) async throws {
            // Before the PIN is used: a second agent must not open the vault at all.
            let instance = try AgentInstance(phone.dirs)
            defer { instance.release() }
            let vault = try phone.vault()
            guard vault.hasCredentials, !vault.isWiped else { throw Vault.Failure.noCredentials.asPhoneFailure }
            let phoneRadio = try await radio.open(phone)
            defer { phoneRadio.shutdown() }
            let detached = detachedChild
            // A closed terminal or log pipe must not end the agent.
            signal(SIGPIPE, SIG_IGN)
            if detached { try? PrivateFiles.ensureDirectory(phone.dirs.state) }
            // Started in the background, the agent's log lines go to its log from the first one:
            // the terminal that started it shows only the "Agent running" line.
            let logFD = detached ? open(phone.dirs.agentLog, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600) : -1
            let log: @Sendable (String) -> Void = { line in
                let stamped = "\(Date().formatted(.iso8601)) \(line)"
                if logFD >= 0 { Console.write(logFD, Array((stamped + "\n").utf8)) } else { Terminal.say(stamped) }
            }
            let agent = BoxkeyPhone.Agent(phone: phone, radio: phoneRadio, lifetime: lifetime.duration,
                                          proximity: proximity ? BoxkeyPhone.Agent.Proximity() : nil, log: log)
            do {
                // The PIN lives only for the unlock: the agent holds credentials, never the PIN.
                if let lockout = vault.lockout(now: vaultNow()) { throw lockout.asPhoneFailure }
                let pin = vault.hasPIN ? try Terminal.readPIN() : nil
                try await agent.unlock(pin: pin)
            }
            let server = try AgentServer(agent: agent, dirs: phone.dirs, log: log)
            let lifetimeText = lifetime.text
            let signals = Terminal.onSignals([SIGINT, SIGTERM, SIGHUP]) { Task { await server.stop() } }
            defer { signals.forEach { $0.cancel() } }
            try await server.run(ready: {
                Terminal.say("Agent running (pid \(getpid())), credentials held for \(lifetimeText)\(proximity ? "; proximity login on" : "").")
                if detached { Detached.redirectOutput(to: phone.dirs.agentLog) }
            })
            log("agent stopped")
        }
    }

    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show whether the agent runs, holds credentials, and holds a presence link.")
        @Flag(help: "As a JSON object.") var json = false
        func run() async throws {
            try await Terminal.run {
                // The agent is reached through its socket alone: a damaged phone file must not
                // keep anyone from seeing, dropping or stopping it.
                guard let client = AgentClient(PhoneDirectories()) else {
                    // JSON in every state: `{"running": false}`, and the exit code says the same.
                    if json { Terminal.say(#"{"running":false}"#) }
                    throw PhoneFailure(.agentUnavailable, tr("no agent is running (boxkey agent start)"))
                }
                guard case .result(.success, let message, let details) = try client.send(.status) else {
                    throw PhoneFailure(.failure, "the agent did not answer the status request")
                }
                Terminal.say(json ? AgentCommand.withRunning(details) : message)
            }
        }
    }

    /// The running agent's status, or nil when none answers.
    static func runningStatus(_ dirs: PhoneDirectories) -> AgentStatus? {
        guard let client = AgentClient(dirs), case .result(.success, _, let details)? = try? client.send(.status, timeout: .seconds(10)) else { return nil }
        return try? JSONDecoder().decode(AgentStatus.self, from: Data(details.utf8))
    }

    /// The agent's status JSON with `"running": true` added: the same key as when none runs.
    static func withRunning(_ details: String) -> String {
        struct Running: Encodable {
            let status: AgentStatus
            enum Key: String, CodingKey { case running }
            func encode(to encoder: any Encoder) throws {
                try status.encode(to: encoder)
                var c = encoder.container(keyedBy: Key.self)
                try c.encode(true, forKey: .running)
            }
        }
        guard let status = try? JSONDecoder().decode(AgentStatus.self, from: Data(details.utf8)) else { return details }
        return Terminal.json(Running(status: status))
    }

    struct Forget: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Make the agent drop the credentials now (it keeps running; the next login asks the PIN).")
        func run() async throws { try await AgentCommand.simple(.forget) }
    }

    struct Stop: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Stop the agent (a presence link it holds ends as walking away).")
        func run() async throws { try await AgentCommand.simple(.stop) }
    }

    static func simple(_ request: AgentRequest) async throws {
        try await Terminal.run {
            guard let client = AgentClient(PhoneDirectories()) else { throw PhoneFailure(.agentUnavailable, tr("no agent is running (boxkey agent start)")) }
            guard case .result(let outcome, let message, _) = try client.send(request) else { throw PhoneFailure(.failure, "unexpected answer from the agent") }
            guard outcome == .success else { throw PhoneFailure(outcome, message) }
            Terminal.say(message)
        }
    }
}
