import BoxkeyDBus
import BoxkeyRadio

/// Waiting for bluetoothd and an adapter without waking bluetoothd: a box without an adapter
/// must not D-Bus-activate org.bluez over and over (each try is a failed start of
/// bluetooth.service in the journal), and a box whose adapter arrives must start at once.
public enum BlueZWatch {
    /// Runs `open` (which opens BlueZ's adapter) once bluetoothd owns its name on the bus, again
    /// each time bluetoothd comes or goes or an object appears in its tree (an adapter plugged
    /// in), and every `fallback` in case a signal was missed. Asking the bus whether the name
    /// has an owner never starts bluetoothd. `waiting` hears why each try failed.
    public static func waitForAdapter<T: Sendable>(bus busKind: DBusConnection.Bus = .system, fallback: Duration = .seconds(30),
                                                   waiting: @Sendable (String) -> Void,
                                                   _ open: () async throws -> T) async throws -> T {
        while true {
            try Task.checkCancellation()
            let bus: DBusConnection
            do { bus = try DBusConnection(busKind) } catch {
                waiting("cannot reach the system bus: \(error)")
                try await Task.sleep(for: .seconds(5))
                continue
            }
            defer { bus.close() }
            // Subscribed before the first look, so nothing that happens after it is missed.
            let owners = try await bus.signals(SignalMatch(sender: "org.freedesktop.DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged"))
            let added = try await bus.signals(SignalMatch(sender: BlueZ.service, interface: "org.freedesktop.DBus.ObjectManager", member: "InterfacesAdded"))
            let (wake, wakeUp) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
            return try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await signal in owners where signal.arguments.first?.string == BlueZ.service { wakeUp.yield() }
                }
                group.addTask { for await _ in added { wakeUp.yield() } }
                group.addTask {
                    while !Task.isCancelled {
                        try await Task.sleep(for: fallback)
                        wakeUp.yield()
                    }
                }
                defer { group.cancelAll() }
                var wakes = wake.makeAsyncIterator()
                while true {
                    try Task.checkCancellation()
                    let owned = try? await bus.nameHasOwner(BlueZ.service)
                    if owned == true {
                        do { return try await open() } catch RadioError.unavailable(let why) { waiting(why) }
                    } else {
                        waiting(owned == nil ? "the system bus does not answer" : "bluetoothd is not running (no org.bluez on the system bus)")
                    }
                    guard await wakes.next() != nil else { throw CancellationError() }
                }
            }
        }
    }
}
