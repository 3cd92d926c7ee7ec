import BoxkeyDBus
import FoundationEssentials

/// What `boxkeyd doctor` and `boxkey doctor` found: one line per check, and for each problem
/// what to do about it.
public struct DoctorReport: Sendable, Encodable {
    public struct Finding: Sendable, Encodable, Equatable {
        public enum Level: String, Sendable, Encodable { case ok, warning, failed }
        public var level: Level
        public var check: String
        public var detail: String
        public var advice: String?
    }

    public private(set) var findings: [Finding] = []

    public init() {}

    public mutating func ok(_ check: String, _ detail: String) {
        findings.append(.init(level: .ok, check: check, detail: detail))
    }

    public mutating func warn(_ check: String, _ detail: String, do advice: String) {
        findings.append(.init(level: .warning, check: check, detail: detail, advice: advice))
    }

    public mutating func fail(_ check: String, _ detail: String, do advice: String) {
        findings.append(.init(level: .failed, check: check, detail: detail, advice: advice))
    }

    public mutating func append(_ other: DoctorReport) { findings += other.findings }

    public var failed: Bool { findings.contains { $0.level == .failed } }

    /// What a doctor command prints: the report as text, or as a JSON object.
    public func output(json: Bool) -> String {
        guard json else { return text }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        return String(decoding: (try? encoder.encode(self)) ?? Data(), as: UTF8.self)
    }

    /// For people: "ok", "warning" or "FAILED", the check, what was found, and on the next
    /// line what to do.
    public var text: String {
        findings.map { f in
            let mark = switch f.level { case .ok: "ok      "; case .warning: "warning "; case .failed: "FAILED  " }
            return "\(mark)\(f.check): \(f.detail)" + (f.advice.map { "\n        → \($0)" } ?? "")
        }.joined(separator: "\n")
    }
}

/// The checks both ends share: the system bus, bluetoothd, and the adapter (there, powered,
/// not blocked by rfkill).
public enum RadioDoctor {
    /// Where the checks look on this machine: a test points them elsewhere.
    public struct Machine: Sendable {
        /// bluetoothd's program, where Debian's bluez puts it (a symbolic link and the file).
        public var bluetoothd = ["/usr/sbin/bluetoothd", "/usr/libexec/bluetooth/bluetoothd"]
        /// The kernel's Bluetooth controllers (bluetooth.service starts only when it exists).
        public var controllers = "/sys/class/bluetooth"
        public var rfkill = "/sys/class/rfkill"
        public init() {}
    }

    public static func check(adapter wanted: String?, bus busKind: DBusConnection.Bus = .system, machine: Machine = Machine()) async -> DoctorReport {
        var report = DoctorReport()
        let bus: DBusConnection
        do { bus = try DBusConnection(busKind) } catch {
            report.fail("system bus", "cannot connect (\(error))", do: "start D-Bus: systemctl start dbus")
            return report
        }
        defer { bus.close() }
        report.ok("system bus", "connected")
        // Asked of the bus first: a call to org.bluez with no owner would start bluetoothd, and
        // each case below wants its own advice.
        let owned = try? await bus.nameHasOwner("org.bluez", timeout: .seconds(3))
        if owned != true {
            let files = FileManager.default
            if !machine.bluetoothd.contains(where: { files.fileExists(atPath: $0) }) {
                report.fail("bluetoothd", "bluez is not installed: no bluetoothd on this machine",
                            do: "apt install bluez (boxkeyd opens the adapter when bluetoothd starts)")
            } else if ((try? files.contentsOfDirectory(atPath: machine.controllers)) ?? []).isEmpty {
                let why = files.fileExists(atPath: machine.controllers) ? "\(machine.controllers) is empty" : "there is no \(machine.controllers): no Bluetooth in this kernel or container"
                report.fail("adapter", "the kernel has no Bluetooth controller (\(why)), so bluetoothd does not start",
                            do: "plug in a Bluetooth LE adapter: bluetoothd and then boxkeyd take it up by themselves; `dmesg | grep -i bluetooth` says whether the kernel saw one")
            } else {
                report.fail("bluetoothd", "not running (no org.bluez on the system bus), though bluez is installed and the kernel has a controller",
                            do: "systemctl enable --now bluetooth; if it stops again, journalctl -u bluetooth -b says why")
            }
            return report
        }
        let objects: [DBusValue]
        do {
            objects = try await bus.call("org.bluez", "/", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects", timeout: .seconds(3))
        } catch {
            report.fail("bluetoothd", "running but not answering on the system bus (\(error))",
                        do: "systemctl restart bluetooth; journalctl -u bluetooth -b")
            return report
        }
        report.ok("bluetoothd", "answering")
        var adapters: [(name: String, powered: Bool)] = []
        for entry in objects.first?.elements ?? [] {
            guard case .dictEntry(let path, let interfaces) = entry, let p = path.string else { continue }
            for i in interfaces.elements ?? [] {
                guard case .dictEntry(let name, let properties) = i, name.string == "org.bluez.Adapter1" else { continue }
                var powered = false
                for property in properties.elements ?? [] {
                    if case .dictEntry(let key, let value) = property, key.string == "Powered" { powered = value.bool ?? false }
                }
                adapters.append((String(p.split(separator: "/").last ?? ""), powered))
            }
        }
        let wantedName = wanted.flatMap { $0.isEmpty ? nil : $0 }
        guard let adapter = adapters.first(where: { wantedName == nil || $0.name == wantedName }) else {
            let seen = adapters.isEmpty ? "none" : adapters.map(\.name).joined(separator: ", ")
            report.fail("adapter", wantedName.map { "no adapter \($0) (bluetoothd has: \(seen))" } ?? "bluetoothd has no adapter",
                        do: "plug in a Bluetooth LE adapter; `btmgmt info` lists what the kernel sees, `rfkill list` what is blocked")
            return report
        }
        let block = rfkillBlock(machine.rfkill)
        if adapter.powered {
            report.ok("adapter", "\(adapter.name), powered")
        } else if let block {
            report.fail("adapter", "\(adapter.name) is off: \(block)",
                        do: block.contains("hardware") ? "turn the wireless switch on (or the BIOS setting)" : "rfkill unblock bluetooth")
        } else {
            report.warn("adapter", "\(adapter.name) is off", do: "bluetoothctl power on (and AutoEnable=true in /etc/bluetooth/main.conf)")
        }
        return report
    }

    /// "blocked by rfkill" or "blocked by a hardware switch" when a Bluetooth rfkill switch is.
    static func rfkillBlock(_ root: String) -> String? {
        let files = FileManager.default
        for entry in (try? files.contentsOfDirectory(atPath: root)) ?? [] {
            func read(_ name: String) -> String {
                String(((try? String(contentsOfFile: "\(root)/\(entry)/\(name)", encoding: .utf8)) ?? "").filter { !$0.isWhitespace })
            }
            guard read("type") == "bluetooth" else { continue }
            if read("hard") == "1" { return "blocked by a hardware switch (\(read("name")))" }
            if read("soft") == "1" { return "blocked by rfkill (\(read("name")))" }
        }
        return nil
    }
}
