import BoxkeyCore
import CSystemd
import BoxkeyHost
import FoundationEssentials
import Glibc
import Logging

/// The box's audit events. Each kind has a fixed journal `MESSAGE_ID`, so that
/// `journalctl MESSAGE_ID=…` finds every one of its kind whatever the wording, and carries the
/// phone, the user and the PAM service as fields of their own (`BOXKEY_PHONE`, `BOXKEY_USER`,
/// `BOXKEY_SERVICE`). docs/operations.md lists them.
public enum AuditEvent: String, CaseIterable, Sendable {
    case loginAttempt = "login-attempt"
    case loginAccepted = "login-accepted"
    case loginRejected = "login-rejected"
    case pushRefused = "push-refused"
    case notOffered = "not-offered"
    case connectionRefused = "connection-refused"
    case pairing
    case pairingFailed = "pairing-failed"
    case pairingCode = "pairing-code"
    case enrolled
    case revoked
    case sessionRegistered = "session-registered"
    case sessionRefused = "session-refused"
    case sessionAction = "session-action"
    case presence
    case fleet

    /// 128-bit IDs made once (`journalctl --new-id128`); never change one.
    public var messageID: String {
        switch self {
        case .loginAttempt: "36d1701ff98d44c9bdcf6a36b124cada"
        case .loginAccepted: "470f844f6ff94d29b54d379e6f3fee29"
        case .loginRejected: "f33562577614429a8bcbe4f574ff1c78"
        case .pushRefused: "2e9a4e0fd8f14141b1fd9426c0a31ea1"
        case .notOffered: "20c6805ff36e4b109fbf147d0d86a5fe"
        case .connectionRefused: "b537f1dfb7314a5b80821a64679a8594"
        case .pairing: "d819ef09fde94de1bcb1dce26ee4239f"
        case .pairingFailed: "c77f02fbac6a4d529a1aca32a7ae39c0"
        case .pairingCode: "63db96cfa42e4378a977d460891892a4"
        case .fleet: "f3722571fcbf4dd88e3804cc054b84af"
        case .enrolled: "0da6bf58a7174897b58cdbfa8e706ec7"
        case .revoked: "0a16a54fa82c4060ad437660b64fa218"
        case .sessionRegistered: "3ec866fa16a54989bee4a6909fb8e98a"
        case .sessionRefused: "d85fc44c7d2745d2bf5ba0ea1e2a2ee0"
        case .sessionAction: "db0124e78bd34b759e53ebb3fc836197"
        case .presence: "2bdafc376a97477fbd0bc68c3b9defdd"
        }
    }
}

extension Logger {
    /// Logs an audit event with its fields. The message stays the whole story for someone
    /// reading plain text; the fields are for filtering (`journalctl BOXKEY_USER=alice`).
    func audit(_ level: Logger.Level, _ event: AuditEvent, _ message: @autoclosure () -> Logger.Message,
               phone: String? = nil, user: String? = nil, service: String? = nil,
               file: String = #fileID, function: String = #function, line: UInt = #line) {
        var metadata: Logger.Metadata = ["message_id": .string(event.messageID), "boxkey_event": .string(event.rawValue)]
        if let phone { metadata["boxkey_phone"] = .string(phone) }
        if let user { metadata["boxkey_user"] = .string(logSafe(user)) }
        if let service { metadata["boxkey_service"] = .string(logSafe(service)) }
        log(level: level, message(), metadata: metadata, file: file, function: function, line: line)
    }
}

/// boxkeyd's log: to the journal with priorities and fields when its standard error is the
/// journal (systemd says so in `JOURNAL_STREAM`), else one line of text per event on standard
/// error.
public struct DaemonLogHandler: LogHandler {
    public var logLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    private let label: String
    private let toJournal: Bool

    public init(label: String, level: Logger.Level, toJournal: Bool = DaemonLogHandler.standardErrorIsJournal()) {
        self.label = label
        self.logLevel = level
        self.toJournal = toJournal
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// systemd.exec(5): `JOURNAL_STREAM` is "device:inode" of the stream it connected; a
    /// process whose standard error is still that stream may log natively instead.
    public static func standardErrorIsJournal(environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool {
        guard let stream = environment["JOURNAL_STREAM"] else { return false }
        var st = stat()
        guard fstat(2, &st) == 0 else { return false }
        return stream == "\(st.st_dev):\(st.st_ino)"
    }

    /// syslog(3) priorities, as journald and `journalctl -p` read them.
    public static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }

    /// The journal fields of one event: MESSAGE, PRIORITY, the identifier and the code
    /// location, and each metadata key upper-cased (journal field names are A–Z, 0–9 and _).
    public static func journalFields(level: Logger.Level, message: String, metadata: Logger.Metadata,
                                     file: String, function: String, line: UInt) -> [String] {
        var fields = [
            "MESSAGE=\(message)", "PRIORITY=\(priority(level))", "SYSLOG_IDENTIFIER=boxkeyd",
            "CODE_FILE=\(file)", "CODE_LINE=\(line)", "CODE_FUNC=\(function)",
        ]
        for (key, value) in metadata.sorted(by: { $0.key < $1.key }) {
            let name = String(key.uppercased().map { $0.isASCII && ($0.isLetter || $0.isNumber) ? $0 : "_" })
            guard let first = name.first, first != "_", !first.isNumber, name.count <= 64 else { continue }
            fields.append("\(name)=\(value)")
        }
        return fields
    }

    public func log(event: LogEvent) {
        let (level, message, file, function, line) = (event.level, event.message, event.file, event.function, event.line)
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        if toJournal {
            let fields = Self.journalFields(level: level, message: message.description, metadata: all,
                                            file: file, function: function, line: line)
            if Self.send(fields) { return }
        }
        // Text: the fields that are not already in the words, for grep.
        let extra = all.filter { $0.key != "message_id" && $0.key != "audit" }
            .sorted { $0.key < $1.key }.map { "\($0.key)=\(Self.quoted("\($0.value)"))" }.joined(separator: " ")
        let time = Date().ISO8601Format()
        let text = "\(time) \(level) \(label): \(message)\(extra.isEmpty ? "" : " [\(extra)]")\n"
        Console.error(text)
    }

    /// A field's value for the text line: bare when plain, else in quotes with " and \\ escaped,
    /// so a user name like `x boxkey_user=root` cannot read as a field of its own.
    static func quoted(_ value: String) -> String {
        let plain = !value.isEmpty && value.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "._@:-/".contains($0)) }
        if plain { return value }
        return "\"" + value.replacing("\\", with: "\\\\").replacing("\"", with: "\\\"") + "\""
    }

    private static func send(_ fields: [String]) -> Bool {
        // One buffer holds every field; the vectors point into it only while it is pinned.
        var bytes: [UInt8] = []
        var ranges: [Range<Int>] = []
        for field in fields {
            let start = bytes.count
            bytes.append(contentsOf: field.utf8)
            ranges.append(start..<bytes.count)
        }
        return bytes.withUnsafeMutableBytes { raw in
            let vectors = ranges.map { iovec(iov_base: raw.baseAddress! + $0.lowerBound, iov_len: $0.count) }
            return sd_journal_sendv(vectors, Int32(vectors.count)) >= 0
        }
    }
}
