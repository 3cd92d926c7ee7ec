/// A PAM service's auth stack as libpam reads it (`@include`, `include`, `substack`), and
/// whether pam_boxkey sits where it works: before a password module that takes the pushed
/// password (`use_first_pass` or `try_first_pass`), never as the module that ends the stack.
/// Pure: files come through `read`. `boxkeyd doctor` uses it on every configured service.
public enum PAMStack {
    public struct Line: Equatable, Sendable {
        public var control: String
        public var module: String
        public var arguments: [String]
        /// The module's name: "pam_unix" for "/lib/x86_64-linux-gnu/security/pam_unix.so".
        public var name: String {
            let base = module.split(separator: "/").last.map(String.init) ?? module
            return base.hasSuffix(".so") ? String(base.dropLast(3)) : base
        }
    }

    public enum Verdict: Equatable, Sendable {
        case good(verifier: String)
        /// pam_boxkey is not in the stack: no phone login here.
        case absent
        /// Nothing checks the password after it.
        case noVerifierAfter
        /// The module after it asks for a password itself: the push is not used.
        case verifierIgnoresPush(String)
        /// Its control can end the stack, or jump past the password check, on its own success.
        case endsStack(control: String)
        /// Its control fails every login without a push (required, requisite, die, bad).
        case failsWithoutPush(control: String)
        /// The password module after it is optional: a stack where it fails may still succeed.
        case verifierOptional(String)
        /// The password module after it has use_first_pass (never asks) and pam_boxkey does not
        /// ask when no push comes (ask_password): every login without a push fails.
        case lockout(String)
        /// pam_boxkey is in the stack twice: two waits for one push.
        case twice
        /// It comes after the password module: the password prompt shows first.
        case afterVerifier(String)
    }

    /// Modules that check a password (and honour use_first_pass or try_first_pass).
    static let verifiers: Set<String> = ["pam_unix", "pam_sss", "pam_krb5", "pam_ldap", "pam_winbind", "pam_userdb", "pam_matrix"]

    /// The auth lines of `service`, includes expanded in place; nil when its file is missing.
    /// `read` gives a file of /etc/pam.d by name (nil: no such file).
    public static func authLines(_ service: String, read: (String) -> String?) -> [Line]? {
        authLines(service, read: read, depth: 0)
    }

    private static func authLines(_ service: String, read: (String) -> String?, depth: Int) -> [Line]? {
        guard depth < 16, let text = read(service) else { return nil }
        var lines: [Line] = []
        var logical = ""
        for raw in text.split(separator: "\n", omittingEmptySubsequences: false) {
            var line = String(raw)
            if let hash = line.firstIndex(of: "#") { line = String(line[..<hash]) }
            // libpam joins a line ending in \ (spaces after it too) with the next.
            let trimmed = String(line.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
            if trimmed.hasSuffix("\\") { logical += trimmed.dropLast() + " "; continue }
            line = logical + line
            logical = ""
            // libpam reads the type and a control keyword whatever their case, but the values
            // and actions inside [...] exactly as written (an unknown one means "bad").
            var words = tokens(line)
            guard !words.isEmpty else { continue }
            words[0] = words[0].lowercased()
            if words.count > 1 { words[1] = words[1].hasPrefix("[") ? normalized(words[1]) : words[1].lowercased() }
            let first = words[0]
            if first == "@include", words.count > 1 {
                lines += authLines(words[1], read: read, depth: depth + 1) ?? []
                continue
            }
            guard first == "auth" || first == "-auth", words.count >= 3 else { continue }
            if words[1] == "include" || words[1] == "substack" {
                lines += authLines(words[2], read: read, depth: depth + 1) ?? []
                continue
            }
            lines.append(Line(control: words[1], module: words[2], arguments: Array(words.dropFirst(3))))
        }
        return lines
    }

    /// A [...] control with its spaces around "=" taken out and single spaces between pairs:
    /// "[success = done  default=ignore]" is "[success=done default=ignore]".
    static func normalized(_ control: String) -> String {
        let singleSpaced = control.dropFirst().dropLast().split(whereSeparator: \.isWhitespace).joined(separator: " ")
        return "[" + singleSpaced.replacing(" =", with: "=").replacing("= ", with: "=") + "]"
    }

    /// Words of a line; a `[...]` control is one word, spaces and all.
    static func tokens(_ line: String) -> [String] {
        var words: [String] = []
        var word = ""
        var bracket = false
        for c in line {
            if c == "[" { bracket = true }
            if c == "]" { bracket = false }
            if (c == " " || c == "\t") && !bracket {
                if !word.isEmpty { words.append(word); word = "" }
            } else {
                word.append(c)
            }
        }
        if !word.isEmpty { words.append(word) }
        return words
    }

    public static func judge(_ lines: [Line]) -> Verdict {
        guard let at = lines.firstIndex(where: { $0.name == "pam_boxkey" }) else { return .absent }
        let control = lines[at].control
        // Safe: optional, or [value=action ...] where every action is ok or ignore (conv_err may
        // also die). Anything
        // else ends, skips or fails the stack on pam_boxkey's word alone.
        if control != "optional" {
            guard control.hasPrefix("[") else {
                return control == "sufficient" ? .endsStack(control: control) : .failsWithoutPush(control: control)
            }
            for pair in control.dropFirst().dropLast().split(separator: " ") {
                let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
                guard parts.count == 2 else { return .failsWithoutPush(control: control) }  // libpam: bad
                let (value, action) = (parts[0], parts[1])
                if action == "ok" || action == "ignore" { continue }
                // The packaged profile: a failed conversation (Ctrl-D at the prompt) is the
                // person's "stop", not a missing push, and must not lead to a second prompt.
                if value == "conv_err", action == "die" || action == "bad" { continue }
                if value == "success" || action == "done" || Int(action) != nil { return .endsStack(control: control) }
                return .failsWithoutPush(control: control)
            }
            // Values not listed, and no default, mean "bad": a stack fails without a push.
            if !control.contains("default=") { return .failsWithoutPush(control: control) }
        }
        if lines[(at + 1)...].contains(where: { $0.name == "pam_boxkey" }) { return .twice }
        if let before = lines[..<at].first(where: { verifiers.contains($0.name) }) { return .afterVerifier(before.name) }
        guard let verifier = lines[(at + 1)...].first(where: { verifiers.contains($0.name) }) else { return .noVerifierAfter }
        if verifier.control == "optional" { return .verifierOptional(verifier.name) }
        let boxkey = lines[at].arguments
        // answer_prompt: the module answers the verifier's own password question with the push.
        if boxkey.contains("answer_prompt") { return .good(verifier: verifier.name) }
        if verifier.arguments.contains("use_first_pass"), !boxkey.contains("ask_password") { return .lockout(verifier.name) }
        let takesPush = verifier.arguments.contains { $0 == "use_first_pass" || $0 == "try_first_pass" }
        return takesPush ? .good(verifier: verifier.name) : .verifierIgnoresPush(verifier.name)
    }
}
