import BoxkeyBlueZ
import BoxkeyDBus
import Foundation

/// A private `dbus-daemon` for a test. `close()` stops it and waits for it; a test closes it
/// when it ends (`defer { bus.close() }`), deinit only as a last resort.
final class PrivateBus: @unchecked Sendable {
    let address: String
    /// A fresh folder for the bus's files and those of what runs on it, removed by `close()`.
    let directory: String
    private let daemon: FixtureProcess

    init() throws {
        directory = try makeTemporaryDirectory()
        let addressFile = directory + "/bus-address"
        do {
            // Under timeout(1): if the test process dies before closing it, the bus still goes.
            daemon = try FixtureProcess(["/usr/bin/timeout", "600", "/usr/bin/dbus-daemon", "--session", "--nofork", "--print-address=3"],
                                        extraFiles: [3: addressFile])
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        var line: String?
        for _ in 0..<500 {
            if let text = Self.read(addressFile), text.hasSuffix("\n") { line = text; break }
            guard daemon.isRunning else { break }
            usleep(10_000)
        }
        guard let line else {
            daemon.terminate()
            try? FileManager.default.removeItem(atPath: directory)
            throw TestFailure("dbus-daemon printed no address")
        }
        address = line.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    var bus: DBusConnection.Bus { .address(address) }

    /// The file's text, read with read(2): Foundation's String(contentsOfFile:) leaks its buffer
    /// (LeakSanitizer) when it fails on a file still being written.
    static func read(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { Glibc.close(fd) }
        var bytes = [UInt8](repeating: 0, count: 4096)
        let n = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        return n > 0 ? String(decoding: bytes[..<n], as: UTF8.self) : nil
    }

    func close() {
        daemon.terminate()
        try? FileManager.default.removeItem(atPath: directory)
    }

    deinit { close() }
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// bluezoo (PyPI, a BlueZ D-Bus mock) on a private bus with the box's and the phone's adapters:
/// hci0 = `boxAddress`, hci1 = `phoneAddress`. `close()` stops bluezoo and the bus and waits
/// for them; a test closes the world when it ends, deinit only as a last resort.
final class BluezooWorld: @unchecked Sendable {
    let bus: PrivateBus
    private var bluezoo: FixtureProcess
    private var log: String { bus.directory + "/bluezoo.log" }

    static var executable: String {
        if let e = ProcessInfo.processInfo.environment["BOXKEY_BLUEZOO"] { return e }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".venv/bin/bluezoo").path
    }

    convenience init() async throws {
        try await self.init(on: try PrivateBus())
    }

    /// bluezoo coming onto a bus that had no bluetoothd (the world owns the bus from now on).
    init(on bus: PrivateBus) async throws {
        self.bus = bus
        do { bluezoo = try Self.launch(on: bus) } catch {
            bus.close()
            throw error
        }
        do { try await waitForAdapters() } catch {
            close()
            throw error
        }
    }

    private static func launch(on bus: PrivateBus) throws -> FixtureProcess {
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw TestFailure("bluezoo not found at \(executable): run scripts/setup")
        }
        var environment = ProcessInfo.processInfo.environment
        environment["DBUS_SYSTEM_BUS_ADDRESS"] = bus.address
        return try FixtureProcess(["/usr/bin/timeout", "600", executable, "--auto-enable", "--scan-interval", "1",
                                   "--adapter", boxAddress.string, "--adapter", phoneAddress.string],
                                  environment: environment, output: bus.directory + "/bluezoo.log")
    }

    /// Ready when both adapters are on the bus.
    private func waitForAdapters() async throws {
        let probe = try DBusConnection(bus.bus)
        defer { probe.close() }
        for _ in 0..<100 {
            guard bluezoo.isRunning else { break }
            if let reply = try? await probe.call("org.bluez", "/", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects", timeout: .seconds(1)),
               (reply.first?.entries ?? []).filter({ ($0.value.entries ?? []).contains { $0.key.string == "org.bluez.Adapter1" } }).count == 2 {
                return
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        throw TestFailure("bluezoo did not come up: \(output.suffix(2000))")
    }

    /// bluetoothd crashing and systemd starting it again: everything registered with it is gone.
    func restart() async throws {
        // The old one must have left the bus name before the new one asks for it.
        bluezoo.terminate()
        bluezoo = try Self.launch(on: bus)
        try await waitForAdapters()
    }

    func close() {
        bluezoo.terminate()
        bus.close()
    }

    deinit { close() }
}
