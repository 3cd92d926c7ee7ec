import FoundationEssentials
import Glibc

/// Private files of the box and the phone: directories 0700, files 0600, written whole or not
/// at all, and on disk before the call returns (the vault counts a PIN attempt this way before
/// it tries the PIN, so a crash or a full disk cannot skip the count).
public enum PrivateFiles {
    public struct Failure: Error, CustomStringConvertible, Equatable {
        public let description: String
        public init(_ description: String) { self.description = description }
    }

    /// Creates `path` (and its parents) as 0700, or makes an existing one 0700.
    public static func ensureDirectory(_ path: String) throws(Failure) {
        if !FileManager.default.fileExists(atPath: path) {
            do {
                try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            } catch {
                throw Failure("cannot create \(path): \(error)")
            }
        }
        guard chmod(path, 0o700) == 0 else { throw Failure("cannot make \(path) private: \(errnoText())") }
    }

    /// Writes `contents` to `path` as 0600: a temporary file, fsync, rename, fsync of the
    /// directory. Every step is checked; on any failure the old file is left as it was.
    public static func write(_ contents: some ContiguousBytes, to path: String) throws(Failure) {
        let temporary = path + ".tmp-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw Failure("cannot write \(temporary): \(errnoText())") }
        var problem: String?
        contents.withUnsafeBytes { bytes in
            var done = 0
            while done < bytes.count {
                let n = Glibc.write(fd, bytes.baseAddress! + done, bytes.count - done)
                if n < 0, errno == EINTR { continue }
                guard n > 0 else { problem = errnoText(); return }
                done += n
            }
        }
        if problem == nil, fsync(fd) != 0 { problem = errnoText() }
        if close(fd) != 0, problem == nil { problem = errnoText() }
        if problem == nil, rename(temporary, path) != 0 { problem = errnoText() }
        if let problem {
            unlink(temporary)
            throw Failure("cannot write \(path): \(problem)")
        }
        syncDirectory(of: path)
    }

    /// The whole of `path`, or nil when there is no such file. Any other failure (no permission,
    /// too many open files, an I/O error) is an error, never "missing": a caller that creates
    /// the file when it is missing (a phone's key) must not replace one it merely could not read.
    public static func read(_ path: String) throws(Failure) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            let e = errno
            var s = stat()
            if e == ENOENT, lstat(path, &s) != 0 { return nil }
            // A link to something absent (a disk not mounted) is not "no file".
            throw Failure("cannot read \(path): \(e == ENOENT ? "it is a link to a missing file" : String(cString: strerror(e)))")
        }
        defer { close(fd) }
        return try readAll(fd, path: path)
    }

    private static func readAll(_ fd: Int32, path: String) throws(Failure) -> [UInt8] {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        defer { chunk.withUnsafeMutableBytes { _ = memset($0.baseAddress!, 0, $0.count) } }
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress!, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n >= 0 else { throw Failure("cannot read \(path): \(errnoText())") }
            if n == 0 { return out }
            out += chunk[0..<n]
        }
    }

    /// A file of a daemon's own state (the box's), or nil when there is none. It must be this
    /// process's own and writable by no one else — a `secret` one readable by no one else either
    /// — and a regular file, not a link. Anything else is an error naming the file and the fix:
    /// a file another account could have written (a restore, an umask slip, a lax backup) is
    /// never believed, and never silently made private.
    public static func readOwn(_ path: String, secret: Bool = false) throws(Failure) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        guard fd >= 0 else {
            let e = errno
            if e == ENOENT { return nil }
            if e == ELOOP { throw Failure("\(path) is a symbolic link: not used (the box's state is plain files of its own)") }
            // Another account's 0600 file cannot even be opened: say whose it is and the fix,
            // as for one that can.
            var s = stat()
            if e == EACCES, lstat(path, &s) == 0 { try checkOwn(s, path: path, secret: secret) }
            throw Failure("cannot read \(path): \(String(cString: strerror(e)))")
        }
        defer { close(fd) }
        var s = stat()
        guard fstat(fd, &s) == 0 else { throw Failure("cannot read \(path): \(errnoText())") }
        guard (s.st_mode & S_IFMT) == S_IFREG else { throw Failure("\(path) is not a regular file: not used") }
        try checkOwn(s, path: path, secret: secret)
        return try readAll(fd, path: path)
    }

    /// The box's state directory: created 0700; an existing one must be this process's own and
    /// writable by no one else (then it is made 0700). Not a link.
    public static func ensureOwnDirectory(_ path: String) throws(Failure) {
        var s = stat()
        if lstat(path, &s) != 0 {
            guard errno == ENOENT else { throw Failure("cannot look at \(path): \(errnoText())") }
            try ensureDirectory(path)
            return
        }
        guard (s.st_mode & S_IFMT) == S_IFDIR else { throw Failure("\(path) is not a directory\((s.st_mode & S_IFMT) == S_IFLNK ? " (a symbolic link)" : ""): not used") }
        try checkOwn(s, path: path, secret: false)
        guard chmod(path, 0o700) == 0 else { throw Failure("cannot make \(path) private: \(errnoText())") }
    }

    /// Owned by this process's user, and (for `secret`, no access at all) no write for others.
    static func checkOwn(_ s: stat, path: String, secret: Bool) throws(Failure) {
        let me = geteuid()
        guard s.st_uid == me else {
            throw Failure("\(path) belongs to uid \(s.st_uid), not to uid \(me) that runs boxkeyd: not used. If it is this box's own, run: chown \(me) \(path)")
        }
        let mask: mode_t = secret ? 0o077 : 0o022
        guard s.st_mode & mask == 0 else {
            let mode = String(s.st_mode & 0o7777, radix: 8)
            let directory = (s.st_mode & S_IFMT) == S_IFDIR
            let what = secret ? "others may read or write it" : "others may write it"
            throw Failure("\(path) has mode \(mode): \(what), so it is not used. If it is this box's own, run: chmod \(directory ? "700" : "600") \(path)")
        }
    }

    /// Removes `path` and makes the removal durable. Missing is fine.
    public static func remove(_ path: String) throws(Failure) {
        guard unlink(path) == 0 || errno == ENOENT else { throw Failure("cannot remove \(path): \(errnoText())") }
        syncDirectory(of: path)
    }

    /// The rename is durable only once the directory entry is (rename(2), fsync(2)).
    private static func syncDirectory(of path: String) {
        let fd = open(path.parentDirectory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        fsync(fd)
        close(fd)
    }

    static func errnoText() -> String { String(cString: strerror(errno)) }
}
