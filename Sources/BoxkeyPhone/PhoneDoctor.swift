import BoxkeyHost
import FoundationEssentials
import Glibc

/// `boxkey doctor`: what stops this phone logging in, each with what to do. Reads only: it
/// never makes a phone key.
public enum PhoneDoctor {
    public static func run(radio: RadioBackend, adapter: String?, dirs: PhoneDirectories = PhoneDirectories()) async -> DoctorReport {
        var report = DoctorReport()
        if radio == .simulated {
            report.warn("radio", "the simulated radio: only a box on this machine hears it", do: "unset BOXKEY_RADIO (or --radio bluez) for real Bluetooth")
        } else {
            report.append(await RadioDoctor.check(adapter: adapter))
        }
        for (what, path) in [("configuration folder", dirs.config), ("data folder", dirs.data)] {
            var st = stat()
            if stat(path, &st) != 0 {
                report.ok(what, "\(path) not made yet (the first command makes it, 0700)")
            } else if st.st_uid != getuid() || st.st_mode & 0o077 != 0 {
                report.fail(what, "\(path) is mode \(String(st.st_mode & 0o777, radix: 8)), owner uid \(st.st_uid): others may read it", do: "chmod 700 \(path)")
            } else {
                report.ok(what, "\(path), yours only")
            }
        }
        let keyPath = dirs.config + "/phone.key"
        let phone: Phone
        do {
            guard let identity = try PhoneIdentity.load(dirs) else {
                report.warn("phone key", "none yet", do: "boxkey pair <box ID> makes one and pairs")
                return report
            }
            phone = Phone(dirs: dirs, identity: identity, boxes: try PairedBoxes.load(dirs, makingFolders: false))
        } catch {
            report.fail("phone key", "\(error)", do: "fix the file's owner and mode (0600); never delete it unless boxes should see a new phone")
            return report
        }
        for path in [keyPath, dirs.config + "/boxes.json", dirs.vault] {
            var st = stat()
            if stat(path, &st) == 0, st.st_mode & 0o077 != 0 {
                report.fail("file modes", "\(path) is mode \(String(st.st_mode & 0o777, radix: 8)): others may read it", do: "chmod 600 \(path)")
            }
        }
        report.ok("phone key", "fingerprint \(phone.identity.keyPair.publicKey.fingerprint)")
        if phone.boxes.boxes.isEmpty {
            report.warn("boxes", "none paired", do: "boxkey pair <box ID>, with the code the box shows")
        } else {
            report.ok("boxes", phone.boxes.boxes.map { "\($0.id)\($0.id == phone.boxes.defaultBox?.description ? " (default)" : "")" }.joined(separator: ", "))
        }
        switch Vault.state(dirs, identity: phone.identity, now: vaultNow()) {
        case .empty: report.warn("credentials", "none stored", do: "boxkey credentials set")
        case .stored(let pin, let failures, let lockedUntil):
            if let lockedUntil {
                report.warn("credentials", "locked after \(failures) wrong PINs: no PIN is tried until \(localClockTime(lockedUntil)); \(Vault.maxFailures) wipe them", do: "wait, then enter the right PIN (it resets the count)")
            } else if failures > 0 {
                report.warn("credentials", "stored; \(failures) wrong PIN(s) so far, \(Vault.maxFailures) wipe them", do: "the next right PIN resets the count")
            } else {
                report.ok("credentials", "stored\(pin ? ", behind a PIN" : "")")
            }
        case .wiped: report.fail("credentials", "wiped after \(Vault.maxFailures) wrong PINs", do: "boxkey credentials set")
        case .unusable(let why): report.fail("credentials", "the vault is unusable: \(why)", do: "boxkey credentials clear --force, then boxkey credentials set")
        }
        if ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"].map({ !$0.isEmpty }) != true {
            report.warn("runtime folder", "XDG_RUNTIME_DIR is not set: the agent's socket goes to \(dirs.runtime)", do: "log in through a session manager (pam_systemd sets it)")
        }
        if let client = AgentClient(dirs), case .result(.success, _, _)? = try? client.send(.status, timeout: .seconds(5)) {
            report.ok("agent", "running")
        } else {
            report.ok("agent", "not running (optional: boxkey agent start)")
        }
        return report
    }
}
