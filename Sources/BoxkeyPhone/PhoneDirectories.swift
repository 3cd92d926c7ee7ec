import BoxkeyCore
import BoxkeyHost
import FoundationEssentials
import Glibc

/// Where the phone keeps its state, all 0700:
/// - `$XDG_CONFIG_HOME/boxkey`: its key (`phone.key`), the pinned boxes (`boxes.json`);
/// - `$XDG_DATA_HOME/boxkey`: the vault;
/// - `$XDG_STATE_HOME/boxkey`: the agent's log;
/// - `$XDG_RUNTIME_DIR/boxkey`: the agent's socket, and a foreground login's presence link's; without a runtime directory,
///   `$XDG_STATE_HOME/boxkey/run` (not a name in /tmp, which another user could take first).
public struct PhoneDirectories: Sendable {
    public let config: String
    public let data: String
    public let state: String
    public let runtime: String

    public init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        func xdg(_ name: String, _ fallback: String) -> String {
            (environment[name].flatMap { $0.isEmpty ? nil : $0 } ?? fallback) + "/boxkey"
        }
        let home = environment["HOME"] ?? getpwuid(getuid()).flatMap { $0.pointee.pw_dir.map { String(cString: $0) } } ?? "/"
        config = xdg("XDG_CONFIG_HOME", home + "/.config")
        data = xdg("XDG_DATA_HOME", home + "/.local/share")
        state = xdg("XDG_STATE_HOME", home + "/.local/state")
        if let runtime = environment["XDG_RUNTIME_DIR"], !runtime.isEmpty {
            self.runtime = runtime + "/boxkey"
        } else {
            self.runtime = state + "/run"
        }
    }

    public func ensure() throws(PrivateFiles.Failure) {
        for d in [config, data] { try PrivateFiles.ensureDirectory(d) }
    }

    /// The runtime directory, created 0700; an existing one must be a directory this user owns.
    public func ensureRuntime() throws(PrivateFiles.Failure) {
        // Checked before anything is done to it: a symlink planted there by another user must
        // not have its target's mode changed.
        var s = stat()
        if lstat(runtime, &s) == 0, (s.st_mode & S_IFMT) != S_IFDIR || s.st_uid != getuid() {
            throw PrivateFiles.Failure("\(runtime) is not a directory of this user; remove it")
        }
        try PrivateFiles.ensureDirectory(runtime)
        guard lstat(runtime, &s) == 0, (s.st_mode & S_IFMT) == S_IFDIR, s.st_uid == getuid() else {
            throw PrivateFiles.Failure("\(runtime) is not a directory of this user; remove it")
        }
    }

    public var vault: String { data + "/vault" }
    public var agentSocket: String { runtime + "/agent.sock" }
    /// Where a `boxkey login` in the foreground that holds the presence link to `box` listens.
    public func presenceSocket(_ box: BoxID) -> String { runtime + "/presence-\(box).sock" }
    public var agentLog: String { state + "/agent.log" }
}

/// An error about the phone's own files, with what to do about it.
public struct PhoneError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}
