import BoxkeyL10n
import BoxkeyRadio
import FoundationEssentials
import Glibc

/// What boxkey says, in the reader's language (po/boxkey/): this library and the CLI. The CLI
/// sets the locale.
public let tr = Translator(domain: "boxkey")

/// `date` as the person's clock shows it (the local time zone): "14:32:05".
public func localClockTime(_ date: Date) -> String {
    var t = time_t(date.timeIntervalSince1970.rounded(.up))
    var parts = tm()
    localtime_r(&t, &parts)
    var out = [CChar](repeating: 0, count: 32)
    let n = strftime(&out, out.count, "%H:%M:%S", &parts)
    return n > 0 ? String(cString: out) : date.ISO8601Format()
}

extension String {
    /// Padded with spaces to `width` characters, for a label column ("agent:       running");
    /// characters, not bytes, so a translated label lines up too.
    public func padding(_ width: Int) -> String {
        count >= width ? self + " " : self + String(repeating: " ", count: width - count)
    }
}

extension DisconnectReason {
    /// Why a link went, as the person reads it.
    public var sentence: String {
        switch self {
        case .localHost: tr("closed on this side")
        case .remoteUser: tr("the box ended it")
        case .supervisionTimeout: tr("nothing heard from the box: out of range, or it went away")
        case .radioOff: tr("Bluetooth was switched off or restarted")
        }
    }
}
