import BoxkeyCore
import BoxkeyHost
import BoxkeyRadio
import FoundationEssentials

/// The phone's static key (`phone.key`, 0600) and its device secret, created on first use.
/// The key identifies the phone to boxes; the device secret binds the vault to this device.
public struct PhoneIdentity: Sendable {
    public let keyPair: KeyPair
    public let deviceSecret: SecureBytes

    public init(keyPair: KeyPair, deviceSecret: SecureBytes) {
        self.keyPair = keyPair
        self.deviceSecret = deviceSecret
    }

    public static func loadOrCreate(_ dirs: PhoneDirectories) throws -> PhoneIdentity {
        try dirs.ensure()
        let path = dirs.config + "/phone.key"
        // A new identity only when there is no file: one that cannot be read now (permissions,
        // too many open files) is an error, or boxes and the vault would lose this phone.
        if let identity = try load(dirs) { return identity }
        let key = SecureBytes.random(count: 32), secret = SecureBytes.random(count: 32)
        var bytes = key.unprotectedCopy + secret.unprotectedCopy
        defer { secureZero(&bytes) }
        try PrivateFiles.write(bytes, to: path)
        return PhoneIdentity(keyPair: try KeyPair(privateKey: key), deviceSecret: secret)
    }

    /// The phone's identity if it has one; nil only when there is no file. Creates nothing.
    public static func load(_ dirs: PhoneDirectories) throws -> PhoneIdentity? {
        let path = dirs.config + "/phone.key"
        guard var bytes = try PrivateFiles.read(path) else { return nil }
        defer { secureZero(&bytes) }
        guard bytes.count == 64 else { throw PhoneError("\(path) is corrupt; delete it to make a new phone identity (boxes will see a new phone)") }
        return PhoneIdentity(keyPair: try KeyPair(privateKey: SecureBytes(copying: Array(bytes[0..<32]))),
                             deviceSecret: SecureBytes(copying: Array(bytes[32..<64])))
    }
}
