import BoxkeyHost
import FoundationEssentials
import Glibc

/// Which machine the box's identity was made on: the machine ID (`/etc/machine-id`) is kept in
/// `<state>/machine-id`. A box cloned from an image that already had an identity (a template
/// installed on a running system, then copied) comes up with a new machine ID — virt-sysprep,
/// cloud-init and systemd-firstboot make one — and then gets an identity of its own: the
/// image's key, box ID, enrolled phones and sealed passwords are moved aside, never shared by
/// every clone. A machine without a machine ID (empty, or "uninitialized" before first boot)
/// is not checked.
enum MachineBinding {
    /// The files that belong to one box.
    static let boxFiles = ["identity", "phones.json", "escrow.json", "fleet-roster.json"]

    /// `/etc/machine-id`, unless `BOXKEY_MACHINE_ID_FILE` names another (tests).
    static var machineIDPath: String { ProcessInfo.processInfo.environment["BOXKEY_MACHINE_ID_FILE"] ?? "/etc/machine-id" }

    static func currentMachineID(path: String = machineIDPath) -> String? {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        let id = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard id.count == 32, id.allSatisfy(\.isHexDigit) else { return nil }
        return id
    }

    /// Before the box's files are read: if they were made on another machine, moves them to
    /// `<state>/from-<old machine ID>/` and returns what to say; records the machine ID.
    static func check(stateDirectory: String, machineIDPath: String = machineIDPath) throws -> String? {
        guard let current = currentMachineID(path: machineIDPath) else { return nil }
        let recordPath = stateDirectory + "/machine-id"
        let recorded = (try? PrivateFiles.readOwn(recordPath)).flatMap { $0 }.map { String(decoding: $0, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) }
        let hasIdentity = FileManager.default.fileExists(atPath: stateDirectory + "/identity")
        var said: String?
        if let recorded, recorded != current, hasIdentity {
            let aside = stateDirectory + "/from-" + String(recorded.prefix(32).filter(\.isHexDigit))
            try PrivateFiles.ensureDirectory(aside)
            for name in boxFiles where FileManager.default.fileExists(atPath: stateDirectory + "/" + name) {
                guard rename(stateDirectory + "/" + name, aside + "/" + name) == 0 else {
                    throw PrivateFiles.Failure("cannot move \(stateDirectory)/\(name) aside: \(String(cString: strerror(errno)))")
                }
            }
            said = "this box was cloned from an image (machine ID \(recorded.prefix(8))… became \(current.prefix(8))…): it makes a key and box ID of its own; the image's identity, enrolled phones and sealed passwords are in \(aside), unused. Phones pair with this box anew"
        }
        if recorded != current {
            try PrivateFiles.write(Data((current + "\n").utf8), to: recordPath)
        }
        return said
    }
}
