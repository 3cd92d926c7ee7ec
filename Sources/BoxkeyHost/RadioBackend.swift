/// Which radio a process is to use, as its configuration or command line says: BlueZ, the
/// simulated radio, or `auto` (BlueZ when bluetoothd has an adapter). BoxkeyTransports opens it.
public enum RadioBackend: String, Sendable, CaseIterable { case auto, simulated, bluez }
