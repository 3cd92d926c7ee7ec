import BoxkeyCore
import BoxkeyDBus
import BoxkeyHost
import BoxkeyPAMWire
import FoundationEssentials
import Glibc

/// `boxkeyd doctor`: what breaks on a box in the field, each with what to do. Reads only;
/// changes nothing.
public enum BoxDoctor {
    /// Where the PAM modules may be: Debian's multiarch folders (any architecture), then others.
    static var moduleFolders: [String] {
        var folders: [String] = []
        for lib in ["/usr/lib", "/lib"] {  // /usr/lib first: /lib is a link to it on merged-/usr Debian
            for entry in (try? FileManager.default.contentsOfDirectory(atPath: lib))?.sorted() ?? [] where entry.hasSuffix("-linux-gnu") {
                folders.append("\(lib)/\(entry)/security")
            }
        }
        return folders + ["/usr/lib64/security", "/lib64/security", "/usr/lib/security", "/lib/security"]
    }

    /// `listen`: what boxes advertise nearby within a time (nil: no radio to listen on).
    public static func run(config: DaemonConfig, configProblem: String?, configPath: String, pamDirectory: String = "/etc/pam.d",
                           listen: (@Sendable (Duration) async -> [Advertisement])? = nil) async -> DoctorReport {
        var report = DoctorReport()
        if let ownership = DaemonConfig.ownershipProblem(configPath) {
            report.fail("configuration", ownership, do: "boxkeyd will not start (exit 78) until then")
        } else if let configProblem {
            report.fail("configuration", configProblem, do: "fix the line it names; `boxkeyd --check-config` checks again (boxkeyd.conf(5))")
        } else if !config.warnings.isEmpty {
            report.warn("configuration", config.warnings.joined(separator: "; "), do: "take the keys it names out of the file")
        } else {
            let dropIns = DaemonConfig.dropIns(of: configPath)
            let files = (FileManager.default.fileExists(atPath: configPath) ? configPath : "\(configPath) absent: every default")
                + (dropIns.isEmpty ? "" : ", with \(dropIns.count) drop-in(s) from \(configPath).d")
            report.ok("configuration", files)
        }
        if getuid() != 0 {
            report.warn("permissions", "not root: the daemon's socket and state cannot be checked", do: "run it as root: sudo boxkeyd doctor")
        }

        switch config.radio {
        case .simulated:
            report.warn("radio", "[radio] backend = \"simulated\": no phone on real Bluetooth hears this box", do: "set backend = \"bluez\" unless this is a test")
        case .bluez, .auto:
            report.append(await RadioDoctor.check(adapter: config.adapter))
        }
        if let listen { report.append(await boxID(config, heard: await listen(.seconds(3)))) }
        report.append(await logind())
        report.append(await walkAwayLocks(config))
        if getuid() == 0 { report.append(daemon(socket: config.adminSocket)) }
        report.append(stateDirectory(config.stateDirectory))

        if let module = moduleFolders.map({ $0 + "/pam_boxkey.so" }).first(where: { FileManager.default.fileExists(atPath: $0) }) {
            report.ok("PAM module", module)
        } else {
            report.fail("PAM module", "pam_boxkey.so is not in the PAM modules' folder", do: "apt install libpam-boxkey (or scripts/install)")
        }
        // libpam takes an include by absolute path as written, else from /etc/pam.d, then /usr/lib/pam.d.
        let read: (String) -> String? = { name in
            let paths = name.hasPrefix("/") ? [name] : ["\(pamDirectory)/\(name)", "/usr/lib/pam.d/\(name)"]
            return paths.lazy.compactMap { try? String(contentsOfFile: $0, encoding: .utf8) }.first
        }
        // Phone login where the person at the keyboard is not the one being let in, or is
        // already logged in: a push held there for Enter is someone else's to take.
        for service in config.phoneLoginServices.intersection(Self.notForPhoneLogin.keys).sorted() {
            report.warn("[pam] services", "\(service) is listed: \(Self.notForPhoneLogin[service]!)", do: "take \(service) out of [pam] services")
        }
        var anyService = false
        // common-auth too: sudo, su, sshd and polkit include it, and a lockout there locks the admin out.
        for service in config.phoneLoginServices.sorted() + ["common-auth"] {
            guard let lines = PAMStack.authLines(service, read: read) else { continue }
            if service != "common-auth" { anyService = true }
            let check = "PAM service \(service)"
            switch PAMStack.judge(lines) {
            case .good(let verifier):
                report.ok(check, "pam_boxkey, then \(verifier) takes the pushed password")
            case .absent:
                if service != "common-auth" {
                    report.warn(check, "pam_boxkey is not in its auth stack: no phone login here", do: "pam-auth-update --enable boxkey (or add pam/pam-configs/boxkey's line before the password module)")
                }
            case .noVerifierAfter:
                report.fail(check, "nothing checks the password after pam_boxkey", do: "put the password module (pam_unix, pam_sss) after it with try_first_pass")
            case .verifierIgnoresPush(let verifier):
                report.fail(check, "\(verifier) after pam_boxkey asks for the password itself: the push is not used", do: "add try_first_pass to \(verifier)")
            case .endsStack(let control):
                report.fail(check, "pam_boxkey's control \(control) ends or skips the stack on its own success: nothing would check the password", do: "use [success=ok default=ignore]")
            case .failsWithoutPush(let control):
                report.fail(check, "pam_boxkey's control \(control) fails every login that no phone pushes", do: "use [success=ok default=ignore]")
            case .verifierOptional(let verifier):
                report.fail(check, "\(verifier) after pam_boxkey is optional: the stack may succeed when it fails", do: "make \(verifier) required (or Debian's [success=1 default=ignore] before pam_deny)")
            case .lockout(let verifier):
                report.fail(check, "\(verifier) has use_first_pass and pam_boxkey does not ask when no push comes: every password login fails",
                            do: "add ask_password to the pam_boxkey line (the pam-auth-update profile has it)")
            case .twice:
                report.warn(check, "pam_boxkey is in the stack twice: two waits for one push", do: "keep one pam_boxkey line (common-auth, or the service's own)")
            case .afterVerifier(let verifier):
                report.warn(check, "pam_boxkey comes after \(verifier): the password prompt comes first", do: "move pam_boxkey before \(verifier)")
            }
        }
        if !anyService {
            report.warn("PAM services", "none of [pam] services has a file in \(pamDirectory)", do: "install the display manager, or list its service in [pam] services")
        }
        let verify = config.verifyService
        if let lines = PAMStack.authLines(verify, read: read) {
            let first = lines.firstIndex { PAMStack.verifiers.contains($0.name) }
            let before = first.map { Array(lines[..<$0]) } ?? lines
            if lines.contains(where: { $0.name == "pam_boxkey" }) {
                report.fail("PAM service \(verify)", "has pam_boxkey: the box's own check would wait for a push", do: "leave only the password module in \(pamDirectory)/\(verify)")
            } else if first == nil {
                report.warn("PAM service \(verify)", "no password module in it", do: "put the site's verifier in \(pamDirectory)/\(verify) (pam_unix or pam_sss)")
            } else if before.contains(where: { $0.control == "sufficient" || $0.name == "pam_permit" }) || ["optional", "sufficient"].contains(lines[first!].control) {
                report.fail("PAM service \(verify)", "a module can succeed without \(lines[first!].name): any pushed password would pass the box's own check",
                            do: "leave \(lines[first!].name) alone and required in \(pamDirectory)/\(verify)")
            } else {
                report.ok("PAM service \(verify)", "the box's own password check is there")
            }
        } else {
            report.warn("PAM service \(verify)", "\(pamDirectory)/\(verify) is missing: PAM uses \"other\", and new phones cannot be confirmed",
                        do: "install it from the boxkeyd package (pam/examples/boxkey-verify)")
        }
        if let fleet = config.fleet { report.append(fleetDirectory(fleet, stateDirectory: config.stateDirectory)) }
        return report
    }

    /// `[fleet]`: the directory answers the boxes' account with TLS and the roster, and this
    /// box's certificate (if any) is served with a current revocation list.
    static func fleetDirectory(_ fleet: DaemonConfig.Fleet, stateDirectory: String) -> DoctorReport {
        var report = DoctorReport()
        let directory = FleetDirectory(settings: fleet)
        do {
            let (roster, requests, skipped) = try directory.readRoster()
            report.ok("fleet directory", "\(fleet.uri): \(roster.phones.count) phone(s) in \(requests) request(s)\(skipped > 0 ? ", \(skipped) value(s) or entries left out (not phone keys, or ambiguous names)" : "")")
        } catch {
            report.fail("fleet directory", "\(error)", do: "check [fleet] uri, ca_file, bind_dn and the password file (docs/fleet.md); meanwhile the box uses its cache for max_stale_s")
            return report
        }
        guard FileManager.default.fileExists(atPath: stateDirectory + "/" + FleetService.certificateFile) else { return report }
        do {
            let now = Int64(Date().timeIntervalSince1970)
            guard let list = try directory.readRevocations() else {
                report.fail("fleet certificate", "no revocation list at [fleet] revocations_dn: phones refuse this box", do: "boxkeyd fleet revoke-box --fleet-key … (on the admin's machine)")
                return report
            }
            if now > list.nextUpdate {
                report.fail("fleet certificate", "the fleet's revocation list expired: phones refuse every certified box", do: "sign it again: boxkeyd fleet revoke-box --fleet-key …")
            } else if list.nextUpdate - now < 7 * 86_400 {
                report.warn("fleet certificate", "the fleet's revocation list expires in \((list.nextUpdate - now) / 86_400) day(s)", do: "sign it again: boxkeyd fleet revoke-box --fleet-key …")
            } else {
                report.ok("fleet certificate", "installed; revocation list \(list.number) valid for \((list.nextUpdate - now) / 86_400) more day(s)")
            }
        } catch {
            report.fail("fleet certificate", "cannot read the revocation list: \(error)", do: "check [fleet] revocations_dn (docs/fleet.md)")
        }
        return report
    }

    /// Another box nearby with this box's ID: phones that look for the ID may reach the other
    /// box first (they refuse it, its key not being the one they paired with, but cannot log
    /// in meanwhile). IDs made up at first start avoid those heard then; two boxes cloned from
    /// one image, or set by hand, may not.
    static func boxID(_ config: DaemonConfig, heard: [Advertisement]) -> DoctorReport {
        var report = DoctorReport()
        guard let identity = try? BoxIdentity.loadIfPresent(path: config.stateDirectory + "/identity") else {
            report.warn("box ID", "no identity yet in \(config.stateDirectory): the daemon has not run", do: "systemctl start boxkeyd")
            return report
        }
        let own = identity.keyPair.publicKey.advertisementHint
        let others = Set(heard.filter { $0.boxID == identity.boxID && $0.keyHint != own }.map(\.keyHint))
        let boxes = Set(heard.map(\.boxID)).subtracting([identity.boxID]).count
        if others.isEmpty {
            report.ok("box ID", "\(identity.boxID): no other box nearby advertises it (heard \(boxes) other box(es) in 3 s)")
        } else {
            let hints = others.sorted().map { String(format: "%02X", $0) }.joined(separator: ", ")
            report.warn("box ID", "another box nearby advertises box ID \(identity.boxID) (key hint \(hints); this box's is \(String(format: "%02X", own))): a phone looking for \(identity.boxID) may find it first",
                        do: "give one of them another ID: [box] id = \"NNNN\" in boxkeyd.conf, restart it, and pair its phones again")
        }
        return report
    }

    static func logind() async -> DoctorReport {
        var report = DoctorReport()
        do {
            let bus = try DBusConnection(.system)
            defer { bus.close() }
            _ = try await bus.call("org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager", "ListSessions", timeout: .seconds(3))
            report.ok("systemd-logind", "answering")
        } catch {
            report.fail("systemd-logind", "not answering (\(error)): phone login is refused and walk-away cannot lock",
                        do: "systemctl status systemd-logind")
        }
        return report
    }

    /// Programs that lock a session when logind says Lock and then tell logind so (LockedHint),
    /// by process name; and those that lock but never say so.
    static let lockersThatSaySo = ["gnome-shell", "xss-lock", "ksmserver", "kwin_wayland"]
    static let lockersThatDoNotSaySo = ["light-locker", "cinnamon-screensaver", "xfce4-screensaver", "mate-screensaver", "swayidle"]

    /// The local sessions a walk-away would not lock: a text console, or a desktop with no
    /// locker that follows logind and says so. Each is named with what walk-away does to it.
    static func walkAwayLocks(_ config: DaemonConfig) async -> DoctorReport {
        var report = DoctorReport()
        guard config.policy == .lock else { return report }
        let logind = LogindSessionControl(timeout: .seconds(3))
        guard let all = try? await logind.allSessions() else { return report }
        let then = config.notLocked == .logout ? "walk-away ends it ([presence] not_locked = logout)"
                                               : "walk-away leaves it open ([presence] not_locked = keep)"
        for s in all.filter({ $0.isLocal && $0.sessionClass == "user" }).sorted(by: { $0.id < $1.id }) {
            let check = "walk-away: session \(s.id) (\(s.user), \(s.place)\(s.type.isEmpty ? "" : ", \(s.type)"))"
            if s.type == "tty" {
                report.warn(check, "a text console: nothing on it can lock; \(then)", do: "log out of consoles when leaving, or use a desktop")
                continue
            }
            let running = processNames(inScope: s.scope)
            if let locker = lockersThatSaySo.first(where: running.contains) {
                report.ok(check, "\(locker) locks it and tells logind (LockedHint)")
            } else if let locker = lockersThatDoNotSaySo.first(where: running.contains) {
                report.warn(check, "\(locker) locks it but never tells logind (no LockedHint): \(then)",
                            do: "run your locker under xss-lock (Debian's sets LockedHint): xss-lock -- i3lock -n")
            } else {
                report.warn(check, "no locker that follows logind's Lock is running in it: \(then)",
                            do: "start one in the session (gnome-shell, KDE, or xss-lock -- i3lock -n)")
            }
        }
        return report
    }

    /// The names (comm) of the processes in a session's scope, from /proc/PID/cgroup.
    static func processNames(inScope scope: String) -> Set<String> {
        guard !scope.isEmpty else { return [] }
        var names: Set<String> = []
        for pid in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] where pid.allSatisfy(\.isNumber) {
            guard let cgroup = try? String(contentsOfFile: "/proc/\(pid)/cgroup", encoding: .utf8),
                  cgroup.split(separator: "\n").contains(where: { $0.hasSuffix("/" + scope) }),
                  let comm = try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8) else { continue }
            names.insert(comm.trimmed)
        }
        return names
    }

    /// Services phone login has no place in, and why.
    static let notForPhoneLogin: [String: String] = [
        "sudo": "a push for you would wait at any sudo prompt of your session, where a program you run can press Enter",
        "sudo-i": "a push for you would wait at any sudo prompt of your session, where a program you run can press Enter",
        "su": "su runs in someone's terminal session: whoever types there could take a push",
        "su-l": "su runs in someone's terminal session: whoever types there could take a push",
        "runuser": "runuser needs no password; listing it only invites confusion",
        "sshd": "an SSH login is remote: the person at the prompt is not the one at the box",
        "polkit-1": "polkit's agent asks inside a session, where a program can answer for you",
        "cron": "cron asks no one",
    ]

    static func daemon(socket: String) -> DoctorReport {
        var report = DoctorReport()
        // Not running: no socket. Running but not answering: a socket nobody serves.
        guard FileManager.default.fileExists(atPath: socket) else {
            report.fail("boxkeyd", "not running (no \(socket)): logins use the password prompt only",
                        do: "systemctl enable --now boxkeyd; if it stops again, journalctl -u boxkeyd -b says why")
            return report
        }
        do {
            let client = try DaemonSocketClient(path: socket)
            try client.send(.daemonStatus)
            guard case .text(let text) = try client.receiveAdmin(timeoutMilliseconds: 5000),
                  let status = try? AdminJSON.decode(DaemonStatus.self, text) else {
                report.fail("boxkeyd", "answered \(socket) with something unexpected", do: "systemctl restart boxkeyd; journalctl -u boxkeyd")
                return report
            }
            report.ok("boxkeyd", "answering on \(socket): box \(status.boxID), \(status.radio), \(status.enrolledPhones) phone(s) enrolled")
        } catch {
            report.fail("boxkeyd", "\(socket) is there but nobody answers (\(error)): the daemon was killed or hangs; every password prompt with pam_boxkey waits 500 ms for it, then the password alone works; systemd's watchdog restarts a hung daemon within about 20 s",
                        do: "systemctl restart boxkeyd; journalctl -u boxkeyd -b shows its last words")
        }
        return report
    }

    static func stateDirectory(_ path: String) -> DoctorReport {
        var report = DoctorReport()
        var st = stat()
        guard stat(path, &st) == 0 else {
            report.warn("state", "\(path) does not exist yet", do: "boxkeyd makes it when it starts (systemd: StateDirectory=boxkey)")
            return report
        }
        if st.st_uid != 0 || st.st_mode & 0o077 != 0 {
            report.fail("state", "\(path) is mode \(String(st.st_mode & 0o7777, radix: 8)), owner uid \(st.st_uid): others may read the box key",
                        do: "chown root: \(path) && chmod 700 \(path)")
        } else {
            report.ok("state", "\(path), root only")
        }
        // The same rule the daemon applies before it believes a file (PrivateFiles.readOwn); as
        // root only, as the daemon runs.
        guard geteuid() == 0 else { return report }
        for (name, secret) in [("identity", true), ("phones.json", false), ("escrow.json", true)] {
            let file = "\(path)/\(name)"
            do { _ = try PrivateFiles.readOwn(file, secret: secret) } catch {
                report.fail("state \(name)", "\(error)", do: "fix it as said, or restore the file from a backup of the box's own; boxkeyd will not start (exit 78) until then")
            }
        }
        // The fleet's cache is only a cache: one the box may not believe is left unused.
        do { _ = try PrivateFiles.readOwn("\(path)/fleet-roster.json") } catch {
            report.warn("state fleet-roster.json", "\(error)", do: "boxkeyd does not use it; the next read of the directory replaces it (or delete it)")
        }
        return report
    }

}
