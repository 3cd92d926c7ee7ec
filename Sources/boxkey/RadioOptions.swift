import ArgumentParser
import BoxkeyHost
import BoxkeyPhone
import BoxkeyTransports
import FoundationEssentials

extension RadioBackend: ExpressibleByArgument {}

struct RadioOptions: ParsableArguments {
    @Option(help: "Radio: bluez, simulated or auto (default $BOXKEY_RADIO or bluez). auto uses BlueZ when it has an adapter, else the simulated radio, and says so.")
    var radio: RadioBackend = ProcessInfo.processInfo.environment["BOXKEY_RADIO"].flatMap(RadioBackend.init) ?? .bluez

    @Option(help: "BlueZ: the adapter to use, e.g. hci1 (default $BOXKEY_ADAPTER or the first).")
    var adapter: String? = ProcessInfo.processInfo.environment["BOXKEY_ADAPTER"]

    @Option(help: "Simulated radio: the directory shared with the box (default $BOXKEY_SIM_DIR or /tmp/boxkey-sim).")
    var simDirectory: String?

    @Option(help: "Simulated radio: this device's distance from the box's origin, in metres (default: where the last `boxkey sim move` put it, else 1).")
    var simPosition: Double?

    func validate() throws {
        // A misspelt BOXKEY_RADIO must not quietly mean BlueZ.
        if let value = ProcessInfo.processInfo.environment["BOXKEY_RADIO"], !value.isEmpty, RadioBackend(rawValue: value) == nil {
            throw ValidationError("BOXKEY_RADIO must be bluez, simulated or auto, not \"\(value)\"")
        }
    }

    func open(_ phone: Phone) async throws -> any PhoneRadio {
        let opened = try await PhoneRadios.open(radio, adapter: adapter, simDirectory: simDirectory, simPosition: simPosition, identity: phone.identity)
        if radio == .auto, opened is SimulatedPhoneRadio {
            // Never silently: a box on real Bluetooth cannot hear this phone now.
            Console.error("boxkey: no Bluetooth adapter; --radio auto uses the simulated radio\n")
        }
        return opened
    }

    /// The same options, to pass to a child process (`agent start`).
    var arguments: [String] {
        ["--radio", radio.rawValue] + (adapter.map { ["--adapter", $0] } ?? []) + (simDirectory.map { ["--sim-directory", $0] } ?? [])
            + (simPosition.map { ["--sim-position", String($0)] } ?? [])
    }
}
