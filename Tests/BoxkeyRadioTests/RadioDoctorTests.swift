import BoxkeyTestWorlds
import BoxkeyHost
import Foundation
import Testing

/// `doctor`'s radio advice, one case each: what is missing decides what to do, and asking never
/// starts bluetoothd (org.bluez is looked up on the bus, not called).
@Suite struct RadioDoctorTests {
    /// A machine as doctor sees it: which programs exist and which controllers the kernel has.
    func machine(bluez installed: Bool, controllers: [String], in folder: String) throws -> RadioDoctor.Machine {
        var m = RadioDoctor.Machine()
        m.bluetoothd = [installed ? "/bin/sh" : folder + "/no-bluetoothd"]
        m.controllers = folder + "/bluetooth"
        m.rfkill = folder + "/rfkill"
        try FileManager.default.createDirectory(atPath: m.controllers, withIntermediateDirectories: true)
        for name in controllers {
            try FileManager.default.createDirectory(atPath: m.controllers + "/" + name, withIntermediateDirectories: true)
        }
        return m
    }

    func finding(_ report: DoctorReport) -> DoctorReport.Finding? { report.findings.first { $0.level != .ok } }

    @Test func bluezNotInstalled() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let report = await RadioDoctor.check(adapter: nil, bus: bus.bus, machine: try machine(bluez: false, controllers: ["hci0"], in: bus.directory))
        let f = try #require(finding(report))
        #expect(f.level == .failed && f.detail.contains("bluez is not installed") && f.advice?.hasPrefix("apt install bluez") == true, "\(f)")
    }

    @Test func noAdapterSoBluetoothdNeverStarted() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let report = await RadioDoctor.check(adapter: nil, bus: bus.bus, machine: try machine(bluez: true, controllers: [], in: bus.directory))
        let f = try #require(finding(report))
        #expect(f.check == "adapter" && f.detail.contains("no Bluetooth controller") && f.advice?.hasPrefix("plug in") == true, "\(f)")
        #expect(!(f.advice ?? "").contains("apt install"), "bluez is installed: do not tell the admin to install it")
    }

    @Test func bluetoothdStopped() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let report = await RadioDoctor.check(adapter: nil, bus: bus.bus, machine: try machine(bluez: true, controllers: ["hci0"], in: bus.directory))
        let f = try #require(finding(report))
        #expect(f.check == "bluetoothd" && f.detail.contains("not running") && f.advice?.hasPrefix("systemctl enable --now bluetooth") == true, "\(f)")
    }

    @Test func bluetoothdWithAnAdapterIsOK() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let world = try await BluezooWorld(on: bus, adapters: [boxAddress, phoneAddress])
        defer { world.close() }
        let report = await RadioDoctor.check(adapter: nil, bus: bus.bus, machine: try machine(bluez: true, controllers: ["hci0"], in: bus.directory))
        #expect(finding(report) == nil, "\(report.text)")
        #expect(report.findings.contains { $0.check == "adapter" && $0.level == .ok }, "\(report.text)")
    }
}
