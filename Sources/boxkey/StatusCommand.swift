import ArgumentParser
import BoxkeyCore
import BoxkeyPhone
import FoundationEssentials

extension Boxkey {
    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show this phone's key, paired boxes, the vault's state and the agent's.")
        @Flag(help: "As a JSON object.") var json = false

        struct Report: Encodable {
            struct Box: Encodable {
                var id: String
                var fingerprint: String
                var key: String
                var isDefault: Bool
                var address: String?
            }
            var phoneKey: String
            var fingerprint: String
            var vault: VaultReport
            var agent: AgentStatus?
            var boxes: [Box]
        }

        func run() async throws {
            try await Terminal.run {
                let phone = try Phone.open()
                var agent: AgentStatus?
                if let client = AgentClient(phone.dirs), case .result(.success, _, let details) = try client.send(.status) {
                    agent = try? JSONDecoder().decode(AgentStatus.self, from: Data(details.utf8))
                }
                let report = Report(
                    phoneKey: hex(phone.identity.keyPair.publicKey.bytes), fingerprint: phone.identity.keyPair.publicKey.fingerprint,
                    vault: VaultReport(Vault.state(phone.dirs, identity: phone.identity)), agent: agent,
                    boxes: phone.boxes.boxes.map { .init(id: $0.id, fingerprint: $0.fingerprint, key: $0.key,
                                                         isDefault: $0.id == phone.boxes.defaultBox?.description, address: $0.address) })
                if json { Terminal.say(Terminal.json(report)); return }
                Terminal.say("phone key:   \(report.phoneKey)")
                Terminal.say("fingerprint: \(report.fingerprint)")
                Terminal.say("credentials: \(report.vault.sentence)")
                if let a = agent {
                    let mode = switch a.mode.flatMap(CredentialPush.Kind.init) {
                    case .password?: " (a password)"
                    case .key?: " (no password: key mode)"
                    case .escrow?: " (an escrow secret)"
                    case nil: ""
                    }
                    let proximity = a.proximity == true ? (a.proximityOpen == true ? ", proximity login on" : ", proximity login on (its 30 min after the PIN are over)") : ""
                    Terminal.say("agent:       pid \(a.pid), \(a.credentialsHeld ? "holding credentials for \(a.user ?? "?")\(mode)" : "credentials not held")\(a.presence.map { ", presence link to box \($0.box)\($0.connected ? "" : " (looking for it)")" } ?? "")\(proximity)")
                } else {
                    Terminal.say("agent:       not running")
                }
                if report.boxes.isEmpty { Terminal.say("boxes:       none paired") }
                for b in report.boxes { Terminal.say("box \(b.id):    key \(b.fingerprint)\(b.isDefault ? " (default)" : "")") }
            }
        }
    }

    struct Sim: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Simulated radio controls (demos and tests).", subcommands: [Move.self])
        struct Move: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Walk this phone to a distance from the box: the running presence link follows.")
            @Argument(help: "Target distance in metres.") var metres: Double
            @Option(help: "Seconds the walk takes.") var over = 0.0
            @Option(help: "The simulated radio's directory.") var simDirectory: String?
            func run() async throws {
                try await Terminal.run {
                    let phone = try Phone.open()
                    SimMoves(directory: simDirectory ?? ProcessInfo.processInfo.environment["BOXKEY_SIM_DIR"] ?? "/tmp/boxkey-sim",
                             address: phone.identity.simulatedAddress).post(to: metres, over: over)
                    Terminal.say("Moving to \(metres) m over \(over) s.")
                }
            }
        }
    }
}
