import ArgumentParser
import BoxkeyCore
import BoxkeyPhone
import BoxkeyHost
import Dispatch
import FoundationEssentials
import Glibc
import Synchronization

/// Talking to the person: standard output for results, standard error for questions,
/// progress and failures, secrets read without echo.
enum Terminal {
    static var isInteractive: Bool { isatty(0) == 1 && isatty(2) == 1 }

    /// Runs a command body; a `PhoneFailure` is printed and becomes its exit code.
    static func run(_ body: () async throws -> Void) async throws {
        do { try await body() } catch let f as PhoneFailure {
            clearProgress()
            warn("boxkey: \(f.message)")
            throw ExitCode(f.outcome.rawValue)
        }
    }

    /// A line to standard output, unbuffered, so a log file follows live.
    static func say(_ message: String) {
        Console.out(message + "\n")
    }

    static func warn(_ message: String) {
        Console.error(message + "\n")
    }

    /// "looking for box 4821… 3 s", redrawn in place on a terminal; nothing when piped.
    static func progress(_ line: String) {
        guard isatty(2) == 1 else { return }
        Console.error("\r\u{1B}[2K\(line)")
        progressShown.withLock { $0 = true }
    }

    static func clearProgress() {
        guard progressShown.withLock({ let was = $0; $0 = false; return was }) else { return }
        Console.error("\r\u{1B}[2K")
    }

    private static let progressShown = Mutex(false)

    /// Asks before searching again for a box that was not found: only on a terminal.
    static func offerToSearchAgain(_ id: BoxID) -> Bool {
        guard isInteractive else { return false }
        clearProgress()
        Console.error(tr("Box {box} not found nearby. Search again? [Y/n] ", ("box", id)))
        guard let line = readAnswer() else { return false }
        return ["", "y", "yes"].contains(line.trimmed.lowercased())
    }

    /// Runs `handler` on each of `signals` instead of their default action (Ctrl-C, SIGTERM),
    /// until the returned sources are cancelled.
    /// What Ctrl-C (and SIGTERM) does now in `boxkey login`, which changes as the login goes
    /// on (stop the search, take the push back, leave the presence link): one set of signal
    /// sources for the whole process, and a handler that is replaced. (A second dispatch source
    /// for a signal after the first was cancelled never fired on Linux: the `SIG_IGN` set for
    /// it replaced libdispatch's own handler.) nil: end the process, as the signal would.
    static func onInterrupt(_ handler: (@Sendable (Int32) -> Void)?) {
        _ = interruptSources
        interruptHandler.withLock { $0 = handler }
    }

    private static let interruptHandler = Mutex<(@Sendable (Int32) -> Void)?>(nil)
    private nonisolated(unsafe) static let interruptSources: [any DispatchSourceSignal] = [SIGINT, SIGTERM].map { sig in
        signal(sig, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: sig)
        source.setEventHandler {
            guard let handler = interruptHandler.withLock({ $0 }) else {
                clearProgress()
                Glibc.exit(128 + sig)
            }
            handler(sig)
        }
        source.resume()
        return source
    }

    static func onSignals(_ signals: [Int32], _ handler: @escaping @Sendable () -> Void) -> [any DispatchSourceSignal] {
        signals.map { sig in
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig)
            source.setEventHandler(handler: handler)
            source.resume()
            return source
        }
    }

    static func confirm(_ question: String) -> Bool {
        Console.error("\(question) [y/N] ")
        guard let line = readAnswer() else { return false }
        return ["y", "yes"].contains(line.trimmed.lowercased())
    }

    /// Reads a secret: without echo on a terminal, else one line of standard input. Never nil:
    /// nothing entered is an empty secret (which the vault does not count as an attempt).
    static func readSecret(_ prompt: String) throws(PhoneFailure) -> SecureBytes {
        guard isatty(0) == 1 else { return try readLineSecure() }
        Console.error(prompt)
        var old = termios()
        tcgetattr(0, &old)
        var quiet = old
        quiet.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(0, TCSAFLUSH, &quiet)
        defer { tcsetattr(0, TCSAFLUSH, &old); Console.error("\n") }
        return try readLineSecure()
    }

    /// A PIN for the vault; nothing entered cancels (exit 16) without an attempt, and so does
    /// what cannot be a PIN (on a terminal it is asked again, up to 3 times): a word, or a "y"
    /// meant for another question, never counts toward the wipe.
    static func readPIN(_ prompt: String? = nil) throws -> SecureBytes {
        for _ in 0..<3 {
            let pin = try readSecret(prompt ?? tr("PIN: "))
            guard pin.count > 0 else { throw PhoneFailure(.cancelled, tr("no PIN entered; nothing was tried")) }
            guard Vault.problem(withNewPIN: pin) != nil else { return pin }
            guard isatty(0) == 1 else { break }
            warn(Vault.Failure.notAPIN.description)
        }
        throw Vault.Failure.notAPIN.asPhoneFailure
    }

    /// A new PIN, asked twice: a typo would otherwise set a PIN nobody knows. On a terminal a
    /// PIN that is too short or not digits, or a second entry that differs, is asked again
    /// (3 times); piped, it ends the command.
    static func readNewPIN() throws -> SecureBytes {
        try readTwice(first: tr("New PIN: "), second: tr("New PIN again: "), check: Vault.problem(withNewPIN:),
                      none: tr("no PIN entered; nothing was changed"), differ: tr("the two PINs differ; nothing was changed"))
    }

    /// A password to store, asked twice on a terminal: a typo would otherwise show only as a
    /// rejected login at the box. Piped, once (a script has it right).
    static func readNewPassword() throws -> SecureBytes {
        guard isatty(0) == 1 else { return try readSecret(tr("Password: ")) }
        return try readTwice(first: tr("Password: "), second: tr("Password again: "), check: { _ in nil },
                             none: tr("no password given; nothing was stored"), differ: tr("the two passwords differ; nothing was stored"))
    }

    private static func readTwice(first: String, second: String, check: (SecureBytes) -> String?, none: String, differ: String) throws -> SecureBytes {
        let tries = isatty(0) == 1 ? 3 : 1
        var last = PhoneFailure(.cancelled, differ)
        for _ in 0..<tries {
            let secret = try readSecret(first)
            guard secret.count > 0 else { throw PhoneFailure(.cancelled, none) }
            if let problem = check(secret) {
                last = PhoneFailure(.failure, problem)
                if tries > 1 { warn(problem) }
                continue
            }
            let again = try readSecret(second)
            if again.isEqual(to: secret) { return secret }
            last = PhoneFailure(.cancelled, differ)
            if tries > 1 { warn(differ) }
        }
        throw last
    }

    /// One line of standard input (a name, an answer), read a byte at a time: stdio's buffered
    /// `readLine` would take the lines after it too (piped password and PIN), and they would
    /// be lost to the questions that follow. Nil at end of input.
    static func readAnswer() -> String? {
        var bytes: [UInt8] = []
        var c: UInt8 = 0
        var any = false
        while read(0, &c, 1) == 1 {
            any = true
            if c == 10 { break }
            if c != 13 { bytes.append(c) }
            if bytes.count > 4096 { break }
        }
        return any ? String(decoding: bytes, as: UTF8.self) : nil
    }

    /// One line of standard input into secure memory, without a String copy of it. A line
    /// longer than a password may be is read to its end and refused: cut short, its rest would
    /// become the answer to the next question (a piped PIN).
    private static func readLineSecure() throws(PhoneFailure) -> SecureBytes {
        var bytes: [UInt8] = []
        defer { secureZero(&bytes) }
        bytes.reserveCapacity(CredentialPush.maxPasswordLength + 1)
        var c: UInt8 = 0
        var tooLong = false
        while read(0, &c, 1) == 1 {
            if c == 10 { break }
            if c == 13 { continue }
            if bytes.count < CredentialPush.maxPasswordLength { bytes.append(c) } else { tooLong = true }
        }
        c = 0
        guard !tooLong else {
            throw PhoneFailure(.failure, tr("that line is longer than {n} bytes; nothing was stored or tried", ("n", CredentialPush.maxPasswordLength)))
        }
        return SecureBytes(copying: bytes)
    }

    static func json(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(value)) ?? Data(), as: UTF8.self)
    }
}
