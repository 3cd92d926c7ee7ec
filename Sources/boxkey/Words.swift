import BoxkeyL10n

/// What boxkey says, in the reader's language (po/boxkey/).
let tr = Translator(domain: "boxkey")
