import BoxkeyDBus
import BoxkeyRadio
import Foundation

/// A private `dbus-daemon` for a test. `close()` stops it and waits for it; a test closes it
/// when it ends (`defer { bus.close() }`), deinit only as a last resort.
public final class PrivateBus: @unchecked Sendable {
    public let address: String
    /// A fresh folder for the bus's files and those of what runs on it, removed by `close()`.
    public let directory: String
    private let daemon: FixtureProcess

    public init() throws {
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

    public var bus: DBusConnection.Bus { .address(address) }

    /// The file's text, read with read(2): Foundation's String(contentsOfFile:) leaks its buffer
    /// (LeakSanitizer) when it fails on a file still being written.
    public static func read(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { Glibc.close(fd) }
        var bytes = [UInt8](repeating: 0, count: 4096)
        let n = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        return n > 0 ? String(decoding: bytes[..<n], as: UTF8.self) : nil
    }

    public func close() {
        daemon.terminate()
        try? FileManager.default.removeItem(atPath: directory)
    }

    deinit { close() }
}

public struct TestFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

/// bluezoo (PyPI, a BlueZ D-Bus mock) on a private bus with an adapter per address in
/// `adapters`, named hci0, hci1, ... in that order. `close()` stops bluezoo and the bus and
/// waits for them; a test closes the world when it ends, deinit only as a last resort.
public final class BluezooWorld: @unchecked Sendable {
    public let bus: PrivateBus
    public let adapters: [DeviceAddress]
    private var bluezoo: FixtureProcess
    private var log: String { bus.directory + "/bluezoo.log" }

    static var executable: String {
        if let e = ProcessInfo.processInfo.environment["BOXKEY_BLUEZOO"] { return e }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".venv/bin/bluezoo").path
    }

    public convenience init(adapters: [DeviceAddress]) async throws {
        try await self.init(on: try PrivateBus(), adapters: adapters)
    }

    /// bluezoo coming onto a bus that had no bluetoothd (the world owns the bus from now on).
    public init(on bus: PrivateBus, adapters: [DeviceAddress]) async throws {
        self.bus = bus
        self.adapters = adapters
        do { bluezoo = try Self.launch(on: bus, adapters: adapters) } catch {
            bus.close()
            throw error
        }
        do { try await waitForAdapters() } catch {
            close()
            throw error
        }
    }

    private static func launch(on bus: PrivateBus, adapters: [DeviceAddress]) throws -> FixtureProcess {
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw TestFailure("bluezoo not found at \(executable): run scripts/setup")
        }
        var environment = ProcessInfo.processInfo.environment
        environment["DBUS_SYSTEM_BUS_ADDRESS"] = bus.address
        return try FixtureProcess(["/usr/bin/timeout", "600", executable, "--auto-enable", "--scan-interval", "1"]
                                  + adapters.flatMap { ["--adapter", $0.string] },
                                  environment: environment, output: bus.directory + "/bluezoo.log")
    }

    /// Ready when every adapter is on the bus.
    private func waitForAdapters() async throws {
        let probe = try DBusConnection(bus.bus)
        defer { probe.close() }
        for _ in 0..<100 {
            guard bluezoo.isRunning else { break }
            if let reply = try? await probe.call("org.bluez", "/", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects", timeout: .seconds(1)),
               (reply.first?.entries ?? []).filter({ ($0.value.entries ?? []).contains { $0.key.string == "org.bluez.Adapter1" } }).count == adapters.count {
                return
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        throw TestFailure("bluezoo did not come up: \(output.suffix(2000))")
    }

    /// bluetoothd crashing and systemd starting it again: everything registered with it is gone.
    public func restart() async throws {
        // The old one must have left the bus name before the new one asks for it.
        bluezoo.terminate()
        bluezoo = try Self.launch(on: bus, adapters: adapters)
        try await waitForAdapters()
    }

    public func close() {
        bluezoo.terminate()
        // BOXKEY_TEST_KEEP=1 keeps bluezoo's log of each world (under the temporary directory).
        if ProcessInfo.processInfo.environment["BOXKEY_TEST_KEEP"] != nil {
            try? FileManager.default.copyItem(atPath: log, toPath: FileManager.default.temporaryDirectory.path + "/bluezoo-\(UUID().uuidString.prefix(8)).log")
        }
        bus.close()
    }

    deinit { close() }
}

/// A fresh folder under the temporary directory.
public func makeTemporaryDirectory() throws -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-test-\(UUID().uuidString.prefix(8))").path
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}
