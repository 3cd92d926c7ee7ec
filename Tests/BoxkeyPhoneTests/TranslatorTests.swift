@testable import BoxkeyL10n
import Testing

@Suite struct TranslatorTests {
    @Test func placeholdersAreFilledOnceInAnyOrder() {
        #expect(Translator.fill("{user} at {box}", [("box", 4821), ("user", "alice")]) == "alice at 4821")
        // A value is never read as a placeholder, and unknown or unclosed braces stay as they are.
        #expect(Translator.fill("{user}: {place}", [("user", "{place}"), ("place", "tty1")]) == "{place}: tty1")
        #expect(Translator.fill("{nope} {user", [("user", "alice")]) == "{nope} {user")
    }

    @Test func anUntranslatedMessageIsItsEnglish() {
        let tr = Translator(domain: "boxkey-test-none", directory: "/nonexistent")
        #expect(tr("Logged in to box {box}.", ("box", 4821)) == "Logged in to box 4821.")
        #expect(tr.plural("{n} try", "{n} tries", 1, ("n", 1)) == "1 try")
        #expect(tr.plural("{n} try", "{n} tries", 3, ("n", 3)) == "3 tries")
    }
}
