import ArgumentParser
import BoxkeyCore
import BoxkeyPhone
import BoxkeyHost
import FoundationEssentials

extension Boxkey {
    struct Pair: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Pair with a box: type the one-time code the box shows; it proves you stand at the box and that this is the box.",
            discussion: "The box shows a six-digit pairing code at its login prompt (or `boxkeyd pair-code` prints one). The code is bound into the handshake (CPace + Noise IKpsk2), so a wrong code or another box fails and nothing is pinned. After pairing, log in within 5 minutes (boxkey login) to finish enrolment at the box. For a phone an administrator enrolled with `boxkeyd phones enrol`, pin the box key instead with --box-key.")
        @Argument(help: "The box ID shown on the box (four digits).") var id: BoxID
        @Option(help: "The pairing code shown on the box (asked for when missing).") var code: String?
        @Option(help: "Pin this box key (64 hex digits, from `boxkeyd status`) without a code: for a phone an administrator pre-enrolled.") var boxKey: String?
        @Flag(help: "Replace a key pinned earlier for this box ID (a reinstalled box).") var replace = false
        @OptionGroup var radio: RadioOptions

        static var notACode: PhoneFailure {
            PhoneFailure(.usage, tr("a pairing code is {n} digits, as the box shows it; nothing was sent", ("n", PairingCode.digits)))
        }

        func validate() throws {
            if let boxKey, unhex(boxKey).flatMap({ try? PublicKey($0) }) == nil { throw ValidationError("--box-key takes 64 hex digits") }
        }

        func run() async throws {
            try await Terminal.run {
                // A mistyped code is a slip, not a misuse of the command: the reason, no usage banner.
                if let code, PairingCode(code) == nil { throw Self.notACode }
                var phone = try Phone.open()
                if let boxKey, let key = unhex(boxKey).flatMap({ try? PublicKey($0) }) {
                    try phone.pin(id, key: key, replace: replace)
                    Terminal.say(tr("Pinned box {box} (key {fingerprint}).", ("box", id), ("fingerprint", key.fingerprint)))
                    return
                }
                if phone.boxes.key(of: id) != nil, !replace {
                    throw PhoneFailure(.failure, tr("box {box} is already paired; use --replace to pair again (a reinstalled box)", ("box", id)))
                }
                let typed = code ?? {
                    Console.error(tr("Pairing code shown on box {box}: ", ("box", id)))
                    return Terminal.readAnswer() ?? ""
                }()
                guard let pairingCode = PairingCode(typed) else { throw Self.notACode }
                let phoneRadio = try await radio.open(phone)
                defer { phoneRadio.shutdown() }
                let key = try await phone.pair(id, code: pairingCode, replace: replace, radio: phoneRadio.central,
                                               progress: { Terminal.progress(tr("looking for box {box}… {seconds} s", ("box", id), ("seconds", $0.components.seconds))) })
                Terminal.clearProgress()
                Terminal.say(tr("Paired with box {box} (key {fingerprint}, verified by the code).", ("box", id), ("fingerprint", key.fingerprint)))
                Terminal.say(tr("Unless an administrator's code enrolled it already, this phone's first login (boxkey login, within a few minutes) enrols it at the box."))
            }
        }
    }

    struct Forget: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Forget a paired box (its pinned key).")
        @Argument(help: "The box ID (four digits).") var id: BoxID
        func run() async throws {
            try await Terminal.run {
                var phone = try Phone.open()
                guard (try? phone.boxes.forget(id)) == true else { throw PhoneFailure(.notPaired, tr("box {box} is not paired", ("box", id))) }
                Terminal.say(tr("Forgot box {box}.", ("box", id)))
            }
        }
    }
}
