import ArgumentParser
import BoxkeyCore
import BoxkeyL10n
import BoxkeyPhone

extension Boxkey {
    /// `boxkey fleet`: the fleet keys this phone trusts to certify boxes (docs/fleet.md).
    struct Fleet: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Trust a fleet key: boxes it certifies are taken without pairing, while the fleet's revocation list they serve is current.",
            subcommands: [Show.self, Trust.self, Forget.self], defaultSubcommand: Show.self)

        struct Show: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "List the fleet keys this phone trusts, and the newest revocation list seen under each.")
            func run() async throws {
                try await Terminal.run {
                    let phone = try Phone.open()
                    if phone.fleet.keys.isEmpty { Terminal.say("This phone trusts no fleet key: it pairs with each box.") }
                    for key in phone.fleet.keys {
                        Terminal.say("\(key.fingerprint)  \(hex(key.bytes))  revocation list \(phone.fleet.newestList(key)) seen")
                    }
                }
            }
        }

        struct Trust: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Trust a fleet key (64 hex digits, from the fleet's admin: `boxkeyd fleet key` printed it).",
                discussion: "Whoever holds that key's secret half can certify a box this phone then sends credentials to: take it only from your admin, by a path you trust, and compare its fingerprint.")
            @Argument(help: "The fleet's public key, 64 hex digits.") var key: String
            func run() async throws {
                try await Terminal.run {
                    guard let bytes = unhex(key.lowercased()), let fleetKey = try? Ed25519.PublicKey(bytes) else {
                        throw PhoneFailure(.usage, "a fleet key is 64 hex digits")
                    }
                    var phone = try Phone.open()
                    do { try phone.fleet.trust(fleetKey) } catch { throw PhoneFailure(.failure, "\(error)") }
                    Terminal.say("Trusting fleet key \(fleetKey.fingerprint): boxes it certifies are taken without pairing.")
                }
            }
        }

        struct Forget: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Stop trusting a fleet key (by a unique prefix of its fingerprint).")
            @Argument(help: "The fleet key's fingerprint, or a unique prefix of it.") var fingerprint: String
            func run() async throws {
                try await Terminal.run {
                    var phone = try Phone.open()
                    guard let gone = (try? phone.fleet.forget(fingerprint)) ?? nil else {
                        throw PhoneFailure(.failure, "no single trusted fleet key matches \(fingerprint)")
                    }
                    // The boxes it vouched for go with it: none is ever used as a paired box.
                    let boxes = (try? phone.boxes.forgetBoxes(certifiedBy: gone)) ?? []
                    Terminal.say("No longer trusting fleet key \(gone.fingerprint)\(boxes.isEmpty ? "" : "; forgot the boxes it certified: \(boxes.joined(separator: ", "))").")
                }
            }
        }
    }
}
