import BoxkeyCore
import BoxkeyRadio
import FoundationEssentials

extension Phone {
    /// Pairs with box `id` under the code it shows: the handshake (CPace + Noise IKpsk2) proves
    /// the code and the box's key at once, so nothing is pinned unless both hold.
    public mutating func pair(_ id: BoxID, code: PairingCode, replace: Bool, radio: any CentralRadio,
                              progress: (@Sendable (Duration) -> Void)? = nil) async throws(PhoneFailure) -> PublicKey {
        if boxes.key(of: id) != nil, !replace {
            throw PhoneFailure(.failure, tr("box {box} is already paired; use --replace to pair again (a reinstalled box)", ("box", id)))
        }
        let heard = try await find(id, pinned: nil, radio: radio, searchTime: Self.searchTime, progress: progress)
        // The key Info claims is unauthenticated; the handshake under the code proves it.
        var opened: (BoxInfo, BoxLink)?
        for attempt in 1...Self.connectionAttempts where opened == nil {
            do {
                opened = try await BoxLink.openForPairing(to: heard, identity: identity, radio: radio, code: code) { info in
                    guard info.boxID == id else { throw PhoneFailure(.failure, "the box answering as \(id) says it is \(info.boxID)") }
                }
            } catch let f as PhoneFailure {
                throw f
            } catch BoxLink.Failure.radio(let s) {
                if attempt < Self.connectionAttempts { continue }
                throw PhoneFailure(.radioUnavailable, tr("cannot pair with box {box}: {why}", ("box", id), ("why", s)))
            } catch {
                throw failure(error, box: id)
            }
        }
        let (info, link) = opened!
        do {
            try await link.send(.pair)
            guard case .actionResult(let r) = try await link.next(timeout: .seconds(10)), r.action == .pair, r.outcome == .done else {
                await link.close()
                throw PhoneFailure(.failure, tr("box {box} did not confirm the pairing", ("box", id)))
            }
        } catch let f as PhoneFailure {
            throw f
        } catch {
            await link.close()
            throw PhoneFailure(.pairingFailed, tr("pairing failed: {why}", ("why", "\(error)")))
        }
        await link.close()
        do { try boxes.pin(id, key: info.staticKey, address: heard.address) } catch { throw PhoneFailure(.failure, "\(error)") }
        return info.staticKey
    }

    /// Pins a box key an administrator gave (for a phone enrolled with `boxkeyd phones enrol`).
    public mutating func pin(_ id: BoxID, key: PublicKey, replace: Bool) throws(PhoneFailure) {
        if let old = boxes.key(of: id), old != key, !replace {
            throw PhoneFailure(.failure, tr("box {box} is pinned to another key ({fingerprint}); use --replace for a reinstalled box", ("box", id), ("fingerprint", old.fingerprint)))
        }
        do { try boxes.pin(id, key: key, address: nil) } catch { throw PhoneFailure(.failure, "\(error)") }
    }
}

extension Vault {
    /// Seals the credentials again under `newPIN` (nil: no PIN), after opening them with
    /// `oldPIN` (counted like any attempt).
    public mutating func reseal(oldPIN: SecureBytes?, newPIN: SecureBytes?, now: Date) throws(PhoneFailure) {
        do {
            let (user, password) = try credentials(pin: oldPIN, now: now)
            try store(user: user, password: password, pin: newPIN)
        } catch let f as Vault.Failure {
            throw f.asPhoneFailure
        } catch {
            throw PhoneFailure(.failure, "\(error)")
        }
    }
}
