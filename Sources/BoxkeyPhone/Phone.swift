import BoxkeyCore
import BoxkeyRadio
import CBoxkeySys
import FoundationEssentials
import Glibc

/// This phone: its folders, its identity, the boxes it paired with. Every phone command starts
/// here; failures come back as `PhoneFailure`s with their outcome.
public struct Phone: Sendable {
    public let dirs: PhoneDirectories
    public let identity: PhoneIdentity
    public var boxes: PairedBoxes
    public var fleet: FleetTrust

    /// Loads (or creates) the phone's state. The process may come to hold a password: it is
    /// kept out of core files, its files are private, and a file-size limit makes writes fail
    /// (SIGXFSZ ignored) rather than kill it half-way through counting a PIN attempt.
    public static func open(_ dirs: PhoneDirectories = PhoneDirectories()) throws(PhoneFailure) -> Phone {
        _ = boxkey_disable_core_dumps()
        umask(0o077)
        signal(SIGXFSZ, SIG_IGN)
        do {
            return Phone(dirs: dirs, identity: try PhoneIdentity.loadOrCreate(dirs), boxes: try PairedBoxes.load(dirs), fleet: try FleetTrust.load(dirs))
        } catch {
            throw PhoneFailure(.failure, "\(error)")
        }
    }

    public init(dirs: PhoneDirectories, identity: PhoneIdentity, boxes: PairedBoxes, fleet: FleetTrust? = nil) {
        self.dirs = dirs
        self.identity = identity
        self.boxes = boxes
        self.fleet = fleet ?? FleetTrust(path: dirs.config + "/fleet.json")
    }

    public func vault() throws(PhoneFailure) -> Vault {
        do { return try Vault.load(dirs, identity: identity) } catch let f as Vault.Failure { throw f.asPhoneFailure } catch {
            throw PhoneFailure(.vaultUnusable, "\(error)")
        }
    }

    /// The box meant: the one named, or the default box.
    public func boxID(_ id: BoxID?) throws(PhoneFailure) -> BoxID {
        if let id { return id }
        guard let id = boxes.defaultBox else { throw PhoneFailure(.notPaired, tr("no box given and no default box: pair with one first (boxkey pair 4821)")) }
        return id
    }

    /// Before a login: the box is paired, or a fleet key is trusted (its certificate decides).
    public func checkReachable(_ id: BoxID) throws(PhoneFailure) {
        if fleet.keys.isEmpty { _ = try pinnedKey(id) }
    }

    public func pinnedKey(_ id: BoxID) throws(PhoneFailure) -> PublicKey {
        guard boxes.box(id)?.viaFleet != true else { throw noLongerTrusted(id) }
        guard let key = boxes.key(of: id) else {
            throw PhoneFailure(.notPaired, fleet.keys.isEmpty ? tr("box {box} is not paired: run boxkey pair {box}", ("box", id))
                                                             : "box \(id) is not paired, and it has not been taken on a fleet certificate yet: log in to it first")
        }
        return key
    }

    /// A box taken on a fleet certificate is never used as a paired box.
    func noLongerTrusted(_ id: BoxID) -> PhoneFailure {
        PhoneFailure(.notPaired, "box \(id) was taken on a fleet certificate, and this phone trusts no fleet key now: pair with it (boxkey pair \(id) --replace)")
    }

    public func keyChanged(_ id: BoxID) -> PhoneFailure {
        PhoneFailure(.keyChanged, """

        @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
        @    WARNING: BOX \(id) PRESENTS A DIFFERENT KEY!           @
        @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
        Someone could be impersonating the box, or it was reinstalled. No credentials were sent.
        The key you paired with is \(boxes.key(of: id)?.fingerprint ?? "?").
        If the box was reinstalled, pair again at the box: its new pairing code proves its new key
            boxkey pair \(id) --replace
        """)
    }

    /// Refusals come before any channel, unauthenticated: anyone in radio range can send one,
    /// so the wording is neutral and never advises forgetting keys.
    public func refusalText(_ r: Refusal, box id: BoxID) -> String {
        switch r.code {
        case .notEnrolled: tr("box {box} says this phone is not enrolled there: pair at the box with the code it shows ({command})", ("box", id), ("command", "boxkey pair \(id)\(boxes.key(of: id) == nil ? "" : " --replace")"))
        case .noPairingCode: tr("box {box} has no pairing code live: show one at its login prompt (or `boxkeyd pair-code`) and try again", ("box", id))
        case .handshakeFailed: tr("box {box} refused the handshake (interference, or a box without the key you paired with); nothing was sent", ("box", id))
        case .phoneRevoked: tr("the box's administrator revoked this phone")
        case .rateLimited: tr("too many failed attempts; the box asks to wait before trying again")
        case .unsupportedVersion: "the box speaks protocol version \(r.versions.lowerBound)...\(r.versions.upperBound); this boxkey speaks \(BoxkeyProtocol.version)"
        case .busy: tr("the box is busy; try again")
        case .staleAdvertisement: tr("the box's advertisement changed while connecting; try again")
        default: "the box refused: \(r.code)"
        }
    }

    /// A link failure as the person should hear it.
    public func failure(_ error: any Error, box id: BoxID) -> PhoneFailure {
        if let f = error as? PhoneFailure { return f }
        guard let f = error as? BoxLink.Failure else { return PhoneFailure(.failure, "box \(id): \(error)") }
        switch f {
        case .keyChanged: return keyChanged(id)
        case .refused(let r): return PhoneFailure(.refused, refusalText(r, box: id), refusal: r.code)
        case .radio(let s): return PhoneFailure(.radioUnavailable, tr("cannot connect to box {box}: {why}", ("box", id), ("why", s)))
        case .pairingFailed: return PhoneFailure(.pairingFailed, tr("pairing failed: the code was wrong, or this is not the box that shows it; nothing was pinned. Check the code on box {box} and try again: a code takes 3 tries unless the box is set otherwise; once they are used, the box's next login prompt shows a new code (a prompt already on the screen keeps showing the old one).", ("box", id)))
        case .timedOut: return PhoneFailure(.timedOut, "box \(id): \(f)")
        case .linkLost, .protocolError: return PhoneFailure(.failure, "box \(id): \(f)")
        }
    }

    public var deviceName: String {
        var name = [CChar](repeating: 0, count: 65)
        gethostname(&name, 64)
        return String(String(cString: name).prefix(CredentialPush.maxDeviceNameLength))
    }
}
