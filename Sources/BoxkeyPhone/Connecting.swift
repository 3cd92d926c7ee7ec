import BoxkeyCore
import BoxkeyRadio
import FoundationEssentials

/// How the phone reaches a paired box, in the order the transport allows:
/// 1. a live link it already holds (the agent's presence link) — for lock and logout; a push
///    always takes a new handshake (one push per handshake, docs/protocol.md);
/// 2. the address and advertisement heard last, while that advertisement's nonce is still
///    accepted (the box takes the current and the previous nonce, so one heard within
///    `cachedAdvertisementLifetime` is good) — no scan;
/// 3. a scan.
/// The nonce in the handshake's prologue is what forces the scan: it proves the phone heard
/// the box recently, so a phone that has not heard it within a rotation period must listen.
extension Phone {
    /// The box's default nonce rotation (60 s); a box set to rotate faster refuses an older
    /// nonce with `staleAdvertisement`, and the phone then scans.
    public static let cachedAdvertisementLifetime: TimeInterval = 55

    public static let searchTime: Duration = .seconds(10)

    /// A connection whose GATT setup failed (a Bluetooth stack's error, a request never
    /// answered) is tried once more on a new connection, as phone apps do: nothing secret has
    /// moved before the Noise channel opens. Seen in the lab over BlueZ 5.66 with Enhanced ATT,
    /// about one connection in eight at MTU 48: a response sent on another bearer than its
    /// request, and the request waiting until the box dropped the link.
    public static let connectionAttempts = 2

    /// Opens a channel to paired box `id`, recording where it was heard.
    public mutating func connect(to id: BoxID, radio: any CentralRadio, searchTime: Duration = Phone.searchTime,
                                 progress: (@Sendable (Duration) -> Void)? = nil) async throws(PhoneFailure) -> BoxLink {
        // A long-running agent's copy may be stale: `boxkey fleet trust/forget` changed the files.
        if let fresh = try? FleetTrust.load(dirs) { fleet = fresh }
        if let fresh = try? PairedBoxes.load(dirs, makingFolders: false) { boxes = fresh }
        // A box taken on its certificate: only ever by its certificate (never as a paired box,
        // even once its fleet key is no longer trusted). An unpaired box, with a fleet key
        // trusted: its certificate and the fleet's revocation list decide, at every connection.
        if boxes.box(id)?.viaFleet == true || (!fleet.keys.isEmpty && boxes.key(of: id) == nil) {
            guard !fleet.keys.isEmpty else { throw noLongerTrusted(id) }
            return try await connectCertified(to: id, radio: radio, searchTime: searchTime, progress: progress)
        }
        let key = try pinnedKey(id)
        if let (cached, at) = boxes.lastHeard(id), Date().timeIntervalSince(at) < Self.cachedAdvertisementLifetime {
            do {
                return try await BoxLink.open(to: cached, boxKey: key, identity: identity, radio: radio, timeout: .seconds(3))
            } catch let f as BoxLink.Failure where f.meansListenAgain {
                // Gone from there, or its nonce moved on: listen for it.
            } catch {
                throw failure(error, box: id)
            }
        }
        var attempts = 0
        while true {
            attempts += 1
            let heard = try await find(id, pinned: key, radio: radio, searchTime: searchTime, progress: progress)
            try? boxes.remember(id, heard: heard)
            do {
                return try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: radio)
            } catch BoxLink.Failure.refused(let r) where r.code == .staleAdvertisement && attempts == 1 {
                continue  // the nonce rotated while connecting: once more with a fresh one
            } catch let f as BoxLink.Failure where f.isConnectionFailure && attempts < Self.connectionAttempts {
                continue
            } catch {
                throw failure(error, box: id)
            }
        }
    }

    /// Connects to a fleet box by its certificate: reads Info, checks the certificate and the
    /// revocation list (`FleetCheck`), then the login handshake proves the certified key.
    mutating func connectCertified(to id: BoxID, radio: any CentralRadio, searchTime: Duration,
                                   progress: (@Sendable (Duration) -> Void)?) async throws(PhoneFailure) -> BoxLink {
        let trusted = fleet.keys, seen = fleet
        let now = Int64(Date().timeIntervalSince1970)
        var attempts = 0
        while true {
            attempts += 1
            let heard = try await find(id, pinned: nil, radio: radio, searchTime: searchTime, progress: progress)
            var verdict: (BoxCertificate, BoxRevocationList, Ed25519.PublicKey)?
            var newer: (BoxRevocationList, Ed25519.PublicKey)?
            do {
                let (info, link) = try await BoxLink.openReadingInfo(to: heard, identity: identity, radio: radio, code: nil) { info in
                    guard info.boxID == id else { throw PhoneFailure(.failure, "the box answering as \(id) says it is \(info.boxID)") }
                    newer = FleetCheck.revocationList(in: info.fleet, trusted: trusted)
                    do {
                        verdict = try FleetCheck.verify(info.fleet, boxID: id, boxKey: info.staticKey, trusted: trusted,
                                                        newestSeen: { seen.newestList($0) }, now: now)
                    } catch {
                        throw PhoneFailure(.keyChanged, "box \(id) is not a box of your fleet: \(error). No credentials were sent.")
                    }
                }
                if let (list, key) = newer { try? FleetTrust.saw(list, under: key, dirs: dirs) }
                guard let (_, _, fleetKey) = verdict else { await link.close(); throw PhoneFailure(.failure, "box \(id): no certificate verdict") }
                try? boxes.pin(id, key: info.staticKey, address: heard.address, fleetKey: fleetKey)
                try? boxes.remember(id, heard: heard)
                return link
            } catch let f as PhoneFailure {
                // A signed list newer than any seen is worth keeping even from a box refused.
                if let (list, key) = newer { try? FleetTrust.saw(list, under: key, dirs: dirs) }
                throw f
            } catch BoxLink.Failure.refused(let r) where r.code == .staleAdvertisement && attempts == 1 {
                continue
            } catch let f as BoxLink.Failure where f.isConnectionFailure && attempts < Self.connectionAttempts {
                continue
            } catch {
                throw failure(error, box: id)
            }
        }
    }

    /// Scans for a box, warning loudly when only a box with another key answers to its ID.
    public func find(_ id: BoxID, pinned key: PublicKey?, radio: any CentralRadio, searchTime: Duration,
                     progress: (@Sendable (Duration) -> Void)? = nil) async throws(PhoneFailure) -> HeardBox {
        let finder = BoxFinder(radio: radio)
        do {
            if let box = try await finder.find(id, pinned: key, timeout: searchTime, progress: progress) { return box }
            if key != nil, try await finder.find(id, pinned: nil, timeout: .milliseconds(300)) != nil { throw keyChanged(id) }
        } catch let f as PhoneFailure {
            throw f
        } catch {
            throw PhoneFailure(.radioUnavailable, "scan failed: \(error)")
        }
        throw PhoneFailure(.notFound, tr("box {box} not found nearby (is boxkeyd running and advertising?)", ("box", id)))
    }
}

extension BoxLink.Failure {
    /// The box was not where it was heard last, or no longer takes that advertisement.
    var meansListenAgain: Bool {
        switch self {
        case .radio, .timedOut, .linkLost: true
        case .refused(let r): r.code == .staleAdvertisement
        default: false
        }
    }

    /// The connection failed before the channel opened, nothing secret having moved: worth one
    /// more. A link lost with no answer counts: a box that hung up as the phone's message 1
    /// overtook its subscription (over BlueZ, with another phone subscribed) sent a refusal
    /// the phone could not hear, such as "stale advertisement".
    var isConnectionFailure: Bool {
        switch self {
        case .radio, .linkLost: true
        default: false
        }
    }
}
