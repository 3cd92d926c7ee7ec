import CSystemd

/// sd_notify(3): readiness, reloads and status lines for systemd (Type=notify). Nothing
/// happens outside systemd (no NOTIFY_SOCKET).
enum SystemdNotify {
    static func send(_ state: String) {
        _ = sd_notify(0, state)
    }
}
