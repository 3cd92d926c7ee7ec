import ArgumentParser
import BoxkeyCore
import BoxkeyPhone
import BoxkeyHost
import FoundationEssentials

extension Boxkey {
    struct Credentials: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Store or clear the user name and password sealed in the vault.",
                                                        subcommands: [Set.self, Clear.self, Show.self], defaultSubcommand: Show.self)
        struct Set: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Store user and password (the password is read without echo, or from standard input).",
                discussion: """
                Piped, standard input is read one line per question, in this order: the user name (only without --user), the password (not with --key-only or --escrow), the current PIN (only when one is set). For example, from a file only you can read: boxkey credentials set < answers.txt
                """)
            @Option(help: "The user name (asked for when missing).") var user: String?
            @Flag(help: "Store no password: log in on this phone's enrolled key alone, at boxes in key mode for you (docs/login-modes.md).")
            var keyOnly = false
            @Flag(help: "Store no password: keep a fresh escrow secret instead, which opens the copy of your password that boxes in escrow mode keep sealed for this phone (docs/login-modes.md).")
            var escrow = false
            func run() async throws {
                guard !(keyOnly && escrow) else { throw ValidationError("--key-only and --escrow exclude each other") }
                try await Terminal.run {
                    let phone = try Phone.open()
                    var vault = try phone.vault()
                    let name: String
                    if let user { name = user } else {
                        Console.error(tr("User: "))
                        name = Terminal.readAnswer()?.trimmed ?? ""
                    }
                    guard !name.isEmpty, name.utf8.count <= CredentialPush.maxUserLength else {
                        throw PhoneFailure(.failure, tr("a user name of 1 to {n} bytes is needed", ("n", CredentialPush.maxUserLength)))
                    }
                    let password = keyOnly ? SecureBytes(count: 0)
                        : escrow ? CredentialPush.escrowField(SecureBytes.random(count: CredentialPush.escrowSecretLength))
                        : try Terminal.readNewPassword()
                    guard password.count > 0 || keyOnly else { throw PhoneFailure(.cancelled, tr("no password given; nothing was stored")) }
                    var pin: SecureBytes?
                    if vault.hasPIN, !vault.isWiped {
                        pin = try Terminal.readPIN()
                        do { try vault.verify(pin: pin, now: vaultNow()) } catch let f as Vault.Failure { throw f.asPhoneFailure }
                    }
                    do { try vault.store(user: name, password: password, pin: pin) } catch { throw PhoneFailure(.failure, "\(error)") }
                    if keyOnly {
                        Terminal.say(tr("User {user} stored with no password: key logins only.", ("user", name)))
                    } else if escrow {
                        Terminal.say(tr("User {user} stored with a new escrow secret and no password: at a box in escrow mode, type the password there once with this phone near.", ("user", name)))
                    } else {
                        Terminal.say(pin == nil ? tr("Credentials for {user} stored.", ("user", name)) : tr("Credentials for {user} stored behind your PIN.", ("user", name)))
                    }
                }
            }
        }
        struct Clear: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Erase the stored credentials (and the PIN).",
                discussion: "A vault that fails its integrity checks (edited, rolled back, or unreadable) is never opened; --force removes its file without reading it, so you can store credentials again.")
            @Flag(help: "Remove the vault file even if it is damaged or was tampered with (nothing in it is read).") var force = false
            func run() async throws {
                try await Terminal.run {
                    let phone = try Phone.open()
                    if force {
                        do { try Vault.remove(phone.dirs) } catch { throw PhoneFailure(.failure, "\(error)") }
                        Terminal.say(tr("Removed {path}.", ("path", phone.dirs.vault)))
                        return
                    }
                    // A damaged vault is refused here with the way out (--force).
                    var vault = try phone.vault()
                    do { try vault.clear() } catch { throw PhoneFailure(.failure, "\(error)") }
                    Terminal.say(tr("Credentials cleared."))
                }
            }
        }
        struct Show: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Say whether credentials are stored (never shows the password).")
            @Flag(help: "As a JSON object.") var json = false
            func run() async throws {
                try await Terminal.run {
                    let phone = try Phone.open()
                    let state = VaultReport(phone, agent: AgentCommand.runningStatus(phone.dirs))
                    Terminal.say(json ? Terminal.json(state) : state.sentence)
                }
            }
        }
    }

    struct PIN: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "pin",
            abstract: "Set, change or clear the vault PIN (at least \(Vault.minimumPINLength) digits; Argon2id, 256 MiB; 10 wrong PINs wipe the credentials).",
            subcommands: [Set.self, Change.self, Clear.self])

        struct Set: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Protect the stored credentials with a PIN.")
            func run() async throws {
                try await Terminal.run {
                    var vault = try Phone.open().vault()
                    guard !vault.hasPIN else { throw PhoneFailure(.failure, tr("a PIN is already set: use boxkey pin change")) }
                    try vault.reseal(oldPIN: nil, newPIN: try Terminal.readNewPIN(), now: vaultNow())
                    Terminal.say(tr("PIN set."))
                }
            }
        }
        struct Change: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Change the PIN.")
            func run() async throws {
                try await Terminal.run {
                    var vault = try Phone.open().vault()
                    let old = vault.hasPIN ? try Terminal.readPIN(tr("Current PIN: ")) : nil
                    try vault.reseal(oldPIN: old, newPIN: try Terminal.readNewPIN(), now: vaultNow())
                    Terminal.say(tr("PIN changed."))
                }
            }
        }
        struct Clear: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Remove the PIN (the credentials stay, protected by this device's key only).")
            func run() async throws {
                try await Terminal.run {
                    var vault = try Phone.open().vault()
                    guard vault.hasPIN else { throw PhoneFailure(.failure, tr("no PIN is set")) }
                    try vault.reseal(oldPIN: try Terminal.readPIN(tr("Current PIN: ")), newPIN: nil, now: vaultNow())
                    Terminal.say(tr("PIN cleared."))
                }
            }
        }
    }
}

/// The vault's state for `credentials` and `status`, in words or JSON (every key always
/// present; docs/phone-json.md).
struct VaultReport: Encodable {
    var credentials: String  // none, stored, wiped, unusable
    var pin: Bool
    var failures: Int
    /// Wrong PINs lock the vault until then (ISO 8601), or nil.
    var lockedUntil: Date?
    var problem: String?
    /// Whose credentials, and what they are ("password", "key": key logins only, "escrow"):
    /// known when the vault has no PIN, or from an agent that holds them; nil while they are
    /// sealed behind the PIN.
    var user: String?
    var kind: String?

    init(_ state: Vault.State) {
        switch state {
        case .empty: (credentials, pin, failures) = ("none", false, 0)
        case .stored(let p, let f, let until): (credentials, pin, failures, lockedUntil) = ("stored", p, f, until)
        case .wiped: (credentials, pin, failures) = ("wiped", false, Vault.maxFailures)
        case .unusable(let why): (credentials, pin, failures, problem) = ("unusable", false, 0, why)
        }
    }

    /// With the user and kind filled in where they can be known without the PIN.
    init(_ phone: Phone, agent: AgentStatus?) {
        self.init(Vault.state(phone.dirs, identity: phone.identity, now: vaultNow()))
        guard credentials == "stored" else { return }
        if !pin, var vault = try? phone.vault(), let (user, password) = try? vault.credentials(pin: nil, now: vaultNow()) {
            self.user = user
            kind = CredentialPush(user: user, password: password, deviceName: "").kind.rawValue
        } else if let agent, agent.credentialsHeld {
            user = agent.user
            kind = agent.mode
        }
    }

    enum CodingKeys: String, CodingKey { case credentials, pin, failures, lockedUntil, problem, user, kind }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(credentials, forKey: .credentials)
        try c.encode(pin, forKey: .pin)
        try c.encode(failures, forKey: .failures)
        try c.encode(lockedUntil?.ISO8601Format(), forKey: .lockedUntil)
        try c.encode(problem, forKey: .problem)
        try c.encode(user, forKey: .user)
        try c.encode(kind, forKey: .kind)
    }

    var sentence: String {
        switch credentials {
        case "stored":
            var text = switch (user, kind) {
            case (let u?, "key"?): tr("stored for {user} (no password: key logins only)", ("user", u))
            case (let u?, "escrow"?): tr("stored for {user} (an escrow secret)", ("user", u))
            case (let u?, _): tr("stored for {user} (a password)", ("user", u))
            case (nil, _): tr("stored")
            }
            if pin { text += user == nil ? tr(", behind a PIN (which keeps the user sealed too)") : tr(", behind a PIN") }
            if failures > 0 { text += tr.plural(", {n} wrong PIN", ", {n} wrong PINs", failures, ("n", failures)) }
            if let lockedUntil { text += tr(": no PIN is tried until {time}", ("time", localClockTime(lockedUntil))) }
            return text
        case "wiped": return tr("wiped after {n} wrong PINs", ("n", Vault.maxFailures))
        case "unusable": return tr("unusable: {why} (boxkey credentials clear --force removes it)", ("why", problem ?? "?"))
        default: return tr("none stored")
        }
    }
}
