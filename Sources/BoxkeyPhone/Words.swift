import BoxkeyL10n

/// What boxkey says, in the reader's language (po/boxkey/). The CLI sets the locale.
let tr = Translator(domain: "boxkey")
