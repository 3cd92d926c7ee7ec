import BoxkeyBlueZ
import BoxkeyDBus
import Foundation

/// A private `dbus-daemon` for a test, torn down with it.
final class PrivateBus: @unchecked Sendable {
    let address: String
    private let daemon: Process

    init() throws {
        daemon = Process()
        // Under timeout(1): if this process dies before its deinit runs, the bus still goes.
        daemon.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        daemon.arguments = ["600", "/usr/bin/dbus-daemon", "--session", "--nofork", "--print-address=1"]
        let out = Pipe()
        daemon.standardOutput = out
        daemon.standardError = FileHandle.nullDevice
        try daemon.run()
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = out.fileHandleForReading.availableData
            guard !chunk.isEmpty else { throw TestFailure("dbus-daemon printed no address") }
            line += chunk
        }
        address = String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    var bus: DBusConnection.Bus { .address(address) }

    // timeout(1) passes SIGTERM on. Foundation reaps the child; waiting here from a test's
    // thread can hang its run loop.
    deinit { kill(daemon.processIdentifier, SIGTERM) }
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// bluezoo (PyPI, a BlueZ D-Bus mock) on a private bus with the box's and the phone's adapters:
/// hci0 = `boxAddress`, hci1 = `phoneAddress`.
final class BluezooWorld: @unchecked Sendable {
    let bus: PrivateBus
    private var bluezoo: Process

    static var executable: String {
        if let e = ProcessInfo.processInfo.environment["BOXKEY_BLUEZOO"] { return e }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".venv/bin/bluezoo").path
    }

    init() async throws {
        bus = try PrivateBus()
        bluezoo = try Self.launch(on: bus)
        try await waitForAdapters()
    }

    private static func launch(on bus: PrivateBus) throws -> Process {
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw TestFailure("bluezoo not found at \(executable): run scripts/setup")
        }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        p.arguments = ["600", executable, "--auto-enable", "--scan-interval", "1", "--adapter", boxAddress.string, "--adapter", phoneAddress.string]
        var environment = ProcessInfo.processInfo.environment
        environment["DBUS_SYSTEM_BUS_ADDRESS"] = bus.address
        p.environment = environment
        let log = FileManager.default.temporaryDirectory.appendingPathComponent("bluezoo-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).log")
        FileManager.default.createFile(atPath: log.path, contents: nil)
        let handle = try FileHandle(forWritingTo: log)
        p.standardOutput = handle
        p.standardError = handle
        try p.run()
        return p
    }

    /// Ready when both adapters are on the bus.
    private func waitForAdapters() async throws {
        let probe = try DBusConnection(bus.bus)
        defer { probe.close() }
        for _ in 0..<100 {
            if let reply = try? await probe.call("org.bluez", "/", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects", timeout: .seconds(1)),
               (reply.first?.entries ?? []).filter({ ($0.value.entries ?? []).contains { $0.key.string == "org.bluez.Adapter1" } }).count == 2 {
                return
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw TestFailure("bluezoo did not come up")
    }

    /// bluetoothd crashing and systemd starting it again: everything registered with it is gone.
    func restart() async throws {
        kill(bluezoo.processIdentifier, SIGTERM)
        // The old one must have left the bus name before the new one asks for it.
        for _ in 0..<100 where bluezoo.isRunning { try await Task.sleep(for: .milliseconds(50)) }
        bluezoo = try Self.launch(on: bus)
        try await waitForAdapters()
    }

    deinit { kill(bluezoo.processIdentifier, SIGTERM) }
}
