import BoxkeyCore
import BoxkeyRadio
import FoundationEssentials
import Glibc
import NIOConcurrencyHelpers

/// Proximity login: listening for paired boxes whose prompt waits, and offering the login at
/// the first one near enough.
extension Agent {
    /// Called about once a second with proximity on. While an offer may be made it listens,
    /// scan after scan, each ending once every paired box was heard (or after a second), and
    /// takes one reading per box per scan: a Bluetooth controller filters duplicate
    /// advertisements within one scan, so a new scan is what brings a new reading (the
    /// simulated radio does the same). It offers the login at the first box whose last
    /// `samples` readings, fresh and from scans one after the other, average at least
    /// `thresholdDBm`, the last of them with its prompt waiting and itself that near. Never
    /// logs in by itself: the box's prompt asks the person, and only their Enter there makes
    /// this phone push. What bounds near → offer:
    /// `samples` × (starting a scan + the box's advertising interval, 100 ms), then one
    /// connection and handshake; a prompt that opens beside a phone already near: the next scan
    /// (within `roomScanPeriod`) and the connection.
    public func proximityTick() async {
        followWalks()
        guard let proximity, mayOffer, !scanning else { if !scanning { heardNear = [:] }; return }
        scanning = true
        defer { scanning = false }
        var keys: [BoxID: PublicKey] = [:]
        for id in phone.boxes.boxes.compactMap({ BoxID($0.id) }) { keys[id] = try? phone.pinnedKey(id) }
        let pinned = keys
        guard !pinned.isEmpty else { return }
        let started = clock.now
        while mayOffer, clock.now - started < Self.listenSpan {
            let scanStarted = clock.now
            let heard = await listenOnce(for: pinned)
            for id in pinned.keys where heard[id] == nil { heardNear[id] = nil }
            for (id, box) in heard {
                guard let rssi = box.rssi else { heardNear[id] = nil; continue }
                // Readings from just before the prompt appeared count (a prompt that opens beside
                // a phone needs one scan that sees it, not three), but only fresh ones: a reading
                // older than `freshness` (a walk away, a suspended phone: the agent's clock counts
                // the suspension) starts the count again. The reading that sees the prompt must
                // itself be near: a mean cannot carry a phone already walking away.
                let heardAt = clock.now
                let fresh = heardNear[id, default: []].filter { heardAt - $0.at <= Self.freshness(proximity) }
                let recent = Array((fresh + [(at: heardAt, rssi: rssi)]).suffix(proximity.samples))
                heardNear[id] = recent
                let values = recent.map(\.rssi)
                guard box.advertisement.flags.contains(.loginPromptWaiting), rssi >= proximity.thresholdDBm,
                      values.count == proximity.samples, values.reduce(0, +) / values.count >= proximity.thresholdDBm, mayOffer else { continue }
                heardNear = [:]
                // Where it was just heard: the login connects there, without scanning again.
                try? phone.boxes.remember(id, heard: box)
                await offer(at: id)
                return
            }
            // Back to back while a box's prompt waits and the phone is in its room (within 20 dB
            // of near); four scans a second while a box is in the room with no prompt, so that
            // a prompt opening there is seen within a quarter second; otherwise two, as a
            // phone's background scanning. All of it only inside the window after the PIN.
            let inRoom = { (box: HeardBox) in (box.rssi ?? .min) >= proximity.thresholdDBm - 20 }
            let approaching = heard.values.contains { $0.advertisement.flags.contains(.loginPromptWaiting) && inRoom($0) }
            let period = approaching ? .zero : heard.values.contains(where: inRoom) ? Self.roomScanPeriod : Self.idleScanPeriod
            while clock.now - scanStarted < period {
                try? await clock.sleep(for: .milliseconds(50))
                followWalks()
            }
        }
    }

    /// How often a scan starts while no paired box is in the room.
    static let idleScanPeriod: Duration = .milliseconds(500)
    /// ...and while one is, with no prompt waiting.
    static let roomScanPeriod: Duration = .milliseconds(250)

    /// How old a reading may be and still count: the span of `samples` scans a phone makes
    /// when no prompt waits, and a second more.
    static func freshness(_ proximity: Proximity) -> Duration { idleScanPeriod * proximity.samples + .seconds(1) }

    /// Listening lasts this long at most; the next tick goes on (a newly paired box).
    static let listenSpan: Duration = .seconds(10)

    /// One scan: the first advertisement of each pinned box (its key hint matching), until all
    /// were heard or a second has passed.
    private func listenOnce(for pinned: [BoxID: PublicKey]) async -> [BoxID: HeardBox] {
        let results = radio.central.scan(ScanFilter(serviceUUIDs: [BoxkeyProtocol.serviceUUID], duplicates: true))
        let heard = NIOLockedValueBox<[BoxID: HeardBox]>([:])
        let clock = clock
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await clock.sleep(for: .seconds(1)) }
            group.addTask {
                do {
                    for try await result in results {
                        guard let advert = result.boxAdvertisement, let key = pinned[advert.boxID], advert.keyHint == key.advertisementHint else { continue }
                        let all = heard.withLockedValue { h -> Bool in
                            if h[advert.boxID] == nil { h[advert.boxID] = HeardBox(address: result.address, advertisement: advert, rssi: result.rssi) }
                            return h.count == pinned.count
                        }
                        if all { return }
                    }
                } catch {}
                try? await clock.sleep(for: .seconds(1))  // a radio that failed: wait out the second, not a tight loop
            }
            // The simulated radio's walks, followed while listening (a real phone just moves).
            if radio.canWalk {
                group.addTask {
                    while !Task.isCancelled {
                        try? await clock.sleep(for: .milliseconds(50))
                        await self.followWalks()
                    }
                }
            }
            _ = await group.next()
            group.cancelAll()
        }
        return heard.withLockedValue { $0 }
    }

    /// Whether an offer may be made now: credentials held, inside the window after the PIN, no
    /// presence link, no login under way, and not just after an offer.
    private var mayOffer: Bool {
        guard let proximity, let held, !stopRequested else { return false }
        return clock.now - held.unlockedAt < proximity.window && !busy && presence == nil && (nextOffer.map { clock.now >= $0 } ?? true)
    }

    /// Simulated radio: `boxkey sim move` walks this phone (the presence link does it while one runs).
    private func followWalks() { if presence == nil { radio.followMoves(log: log) } }

    private func offer(at id: BoxID) async {
        guard let held, !busy, !refusedOffers.contains(id) else { return }
        busy = true
        loginsInProgress += 1
        defer { busy = false; loginsInProgress -= 1; nextOffer = clock.now + .seconds(10) }
        log("box \(id) is near and its prompt waits: offering to log in \(held.user); press Enter at the box")
        var phone = phone
        defer { self.phone = phone }
        do {
            let (report, link) = try await phone.login(to: id, user: held.user, password: held.password, radio: radio.central, offerFirst: true)
            log(report.sentence + " (proximity, Enter at the box)")
            let presenceLink = PresenceLink(box: id, link: link, phone: phone, radio: radio, log: log)
            presence = presenceLink
            linkJobContinuation.yield(.presence(presenceLink))
        } catch {
            log("proximity login at box \(id): \(error.message)")
            if error.refusal == .phoneRevoked || error.refusal == .notEnrolled {
                refusedOffers.insert(id)
                log("no more proximity offers to box \(id): it does not take this phone (pair again there, then restart the agent)")
            }
        }
        await settleHolding()
    }
}
