import Glibc

/// Standard output and error, written whole (write(2) until done) — what Foundation's
/// FileHandle did here, without linking Foundation and its ICU data into the binaries.
public enum Console {
    public static func out(_ text: String) { write(1, Array(text.utf8)) }
    public static func error(_ text: String) { write(2, Array(text.utf8)) }

    public static func write(_ fd: Int32, _ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return }
            offset += n
        }
    }
}

extension String {
    /// The folder part of a path ("." for a bare name), as NSString's deletingLastPathComponent.
    public var parentDirectory: String {
        guard let slash = lastIndex(of: "/") else { return "." }
        return slash == startIndex ? "/" : String(self[..<slash])
    }

    /// Without leading and trailing white space (Foundation's trimmingCharacters(in: .whitespaces)).
    public var trimmed: String {
        String(drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
    }
}
