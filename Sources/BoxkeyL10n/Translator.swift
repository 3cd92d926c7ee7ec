import CBoxkeySys
import Glibc

/// What the CLI says, in the reader's language: gettext catalogs
/// (po/DOMAIN/LANG.po, compiled to LOCALEDIR/LANG/LC_MESSAGES/DOMAIN.mo) chosen by the usual
/// LANGUAGE, LC_ALL, LC_MESSAGES and LANG. A message is English text with named placeholders,
/// `tr("Logged in to box {box} as {user}", ("box", id), ("user", name))`, so a translation can
/// put them in any order and can never be read as a format string.
public struct Translator: Sendable {
    public let domain: String

    /// `directory` overrides where the catalogs are; nil: `$BOXKEY_LOCALEDIR` (ignored in a
    /// setuid process: secure_getenv), else `../share/locale` beside the executable when it
    /// has one (a PREFIX install), else /usr/share/locale.
    public init(domain: String, directory: String? = nil, besideExecutable: Bool = true) {
        self.domain = domain
        let dir = directory
            ?? boxkey_secure_getenv("BOXKEY_LOCALEDIR").map { String(cString: $0) }
            ?? (besideExecutable ? Self.shareLocaleBesideExecutable() : nil)
            ?? "/usr/share/locale"
        bindtextdomain(domain, dir)
        bind_textdomain_codeset(domain, "UTF-8")
    }

    /// For a program (never a PAM module, which lives in the application's locale): take the
    /// locale from the environment, as `setlocale(LC_ALL, "")` does.
    public static func useEnvironmentLocale() {
        setlocale(LC_ALL, "")
    }

    public func callAsFunction(_ msgid: String, _ values: (String, any CustomStringConvertible)...) -> String {
        // Untranslated, dgettext returns the msgid pointer itself: read it while it is alive.
        Self.fill(msgid.withCString { String(cString: dgettext(domain, $0)) }, values)
    }

    /// Another package's message in its own catalog, as that package would say it (the PAM
    /// module asks with Linux-PAM's "Password: ", so a program that recognises it still does).
    public static func foreign(domain: String, _ msgid: String) -> String {
        domain.withCString { d in msgid.withCString { String(cString: dgettext(d, $0)) } }
    }

    /// A message whose form depends on a count (ngettext: Russian has three).
    public func plural(_ singular: String, _ plural: String, _ count: Int, _ values: (String, any CustomStringConvertible)...) -> String {
        Self.fill(singular.withCString { one in
            plural.withCString { many in String(cString: dngettext(domain, one, many, UInt(max(0, count)))) }
        }, values)
    }

    /// Puts each value in place of its {name}, in one pass: a value is never read as a placeholder.
    static func fill(_ text: String, _ values: [(String, any CustomStringConvertible)]) -> String {
        var out = ""
        var rest = Substring(text)
        while let open = rest.firstIndex(of: "{") {
            out += rest[..<open]
            guard let close = rest[open...].firstIndex(of: "}"),
                  let value = values.first(where: { $0.0 == rest[rest.index(after: open)..<close] })?.1 else {
                out.append("{")
                rest = rest[rest.index(after: open)...]
                continue
            }
            out += value.description
            rest = rest[rest.index(after: close)...]
        }
        return out + rest
    }

    /// Glibc only (no Foundation).
    static func shareLocaleBesideExecutable() -> String? {
        var buffer = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        let exe = String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        // PREFIX/bin/boxkey -> PREFIX/share/locale; /usr's is the default anyway, a build folder has none.
        let parts = exe.split(separator: "/", omittingEmptySubsequences: false).dropLast(2)
        let dir = parts.joined(separator: "/") + "/share/locale"
        return access(dir, F_OK) == 0 ? dir : nil
    }
}
