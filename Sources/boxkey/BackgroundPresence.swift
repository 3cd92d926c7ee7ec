import BoxkeyCore
import BoxkeyPhone
import CBoxkeySys
import Foundation

/// `boxkey login --background`: the presence link lives in a detached child process.
enum BackgroundPresence {
    static func stateDirectory(_ dirs: PhoneDirectories) -> String {
        let env = ProcessInfo.processInfo.environment
        let base = env["XDG_STATE_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? ((env["HOME"] ?? NSHomeDirectory()) + "/.local/state")
        let dir = base + "/boxkey"
        try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        return dir
    }

    static func pidFile(_ dirs: PhoneDirectories) -> String { stateDirectory(dirs) + "/presence.pid" }

    /// Runs the child in its own session with the PIN on its standard input; relays its output
    /// until it says it stays connected (returns 0) or exits (returns its status).
    static func spawn(_ arguments: [String], pin: SecureBytes?) -> Int32 {
        var stdinPipe: [Int32] = [0, 0], stdoutPipe: [Int32] = [0, 0]
        guard pipe(&stdinPipe) == 0, pipe(&stdoutPipe) == 0 else { return 1 }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, stdinPipe[0], 0)
        posix_spawn_file_actions_adddup2(&actions, stdoutPipe[1], 1)
        posix_spawn_file_actions_adddup2(&actions, stdoutPipe[1], 2)
        for fd in stdinPipe + stdoutPipe { posix_spawn_file_actions_addclose(&actions, fd) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        posix_spawnattr_setflags(&attributes, boxkey_posix_spawn_setsid())
        var pid: pid_t = 0
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let rc = posix_spawn(&pid, arguments[0], &actions, &attributes, argv, environ)
        close(stdinPipe[0]); close(stdoutPipe[1])
        guard rc == 0 else { return 1 }
        if let pin {
            pin.withUnsafeBytes { _ = write(stdinPipe[1], $0.baseAddress, $0.count) }
            _ = write(stdinPipe[1], "\n", 1)
        }
        close(stdinPipe[1])
        let reader = FileHandle(fileDescriptor: stdoutPipe[0], closeOnDealloc: true)
        var buffer = Data()
        while true {
            let chunk = reader.availableData
            if chunk.isEmpty { break }
            buffer.append(chunk)
            FileHandle.standardOutput.write(chunk)
            if String(decoding: buffer, as: UTF8.self).contains("Staying connected") {
                FileHandle.standardOutput.write("Presence link continues in the background (pid \(pid)).\n".data(using: .utf8)!)
                return 0
            }
        }
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        return (status >> 8) & 0xff
    }

    /// In the child: output goes to the log from now on, and the pid is recorded.
    static func detachOutput(_ dirs: PhoneDirectories) {
        let log = stateDirectory(dirs) + "/presence.log"
        let fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        if fd >= 0 { dup2(fd, 1); dup2(fd, 2); close(fd) }
        FileManager.default.createFile(atPath: pidFile(dirs), contents: "\(getpid())\n".data(using: .utf8), attributes: [.posixPermissions: 0o600])
    }

    static func clear(_ dirs: PhoneDirectories) { unlink(pidFile(dirs)) }

    static func runningPID(_ dirs: PhoneDirectories) -> Int32? {
        guard let text = try? String(contentsOfFile: pidFile(dirs), encoding: .utf8),
              let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)), kill(pid, 0) == 0 else { return nil }
        return pid
    }
}
