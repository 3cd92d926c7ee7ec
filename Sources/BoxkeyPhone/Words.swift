import BoxkeyL10n

/// What boxkey says, in the reader's language (po/boxkey/): this library and the CLI. The CLI
/// sets the locale.
public let tr = Translator(domain: "boxkey")
