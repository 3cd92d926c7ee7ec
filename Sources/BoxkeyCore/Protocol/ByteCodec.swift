/// Little-endian, length-prefixed fields of the app messages, and the printable-text check
/// their strings pass.

func isPrintable(_ s: String) -> Bool {
    s.unicodeScalars.allSatisfy { $0.value >= 0x20 && $0.value != 0x7f && !(0x80...0x9f).contains($0.value) }
}

struct ByteWriter {
    var bytes: [UInt8] = []
    mutating func u8(_ v: UInt8) { bytes.append(v) }
    /// Length-prefixed (1 byte) UTF-8. Callers validate limits first; this truncates defensively.
    mutating func shortText(_ s: String) {
        let utf8 = Array(s.utf8.prefix(255))
        bytes.append(UInt8(utf8.count))
        bytes += utf8
    }
}

struct ByteReader {
    let bytes: UnsafeRawBufferPointer
    let type: AppMessage.MessageType
    var offset = 0

    init(bytes: UnsafeRawBufferPointer, type: AppMessage.MessageType) {
        self.bytes = bytes
        self.type = type
    }

    var atEnd: Bool { offset == bytes.count }

    mutating func u8() throws(AppMessage.DecodeError) -> UInt8 {
        guard offset < bytes.count else { throw .truncated(type) }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func take(_ count: Int) throws(AppMessage.DecodeError) -> UnsafeRawBufferPointer {
        guard count <= bytes.count - offset else { throw .truncated(type) }
        defer { offset += count }
        return UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + count])
    }

    mutating func shortText(field: String, limit: Int) throws(AppMessage.DecodeError) -> String {
        let length = Int(try u8())
        guard length <= limit else { throw .fieldTooLong(field: field, length: length, limit: limit) }
        let raw = try take(length)
        guard let text = String(validating: raw, as: UTF8.self), isPrintable(text) else { throw .invalidText(field: field) }
        return text
    }

    mutating func secret(count: Int) throws(AppMessage.DecodeError) -> SecureBytes {
        SecureBytes(copying: try take(count))
    }
}
