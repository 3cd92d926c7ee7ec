/// Text that came from a phone (user names, device names) or from a PAM peer, made safe for
/// one log line: control characters and every Unicode character that breaks or reorders a line
/// in some reader — C0/C1 controls, U+0085, U+2028/U+2029, the bidirectional embeddings,
/// overrides and isolates (U+202A–U+202E, U+2066–U+2069), U+200E/U+200F, U+061C — are shown as
/// `\u{XXXX}`, and so is the backslash itself, so an escaped line cannot be forged.
/// (The wire decoders already refuse C0/C1 controls; the rest is legal text that a journal
/// reader splitting on Unicode line breaks would turn into a forged line.)
public func logSafe(_ text: String) -> String {
    var out = ""
    out.reserveCapacity(text.utf8.count)
    for scalar in text.unicodeScalars {
        if isLineOrDirectionControl(scalar) || scalar == "\\" {
            out += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
        } else {
            out.unicodeScalars.append(scalar)
        }
    }
    return out
}

func isLineOrDirectionControl(_ s: Unicode.Scalar) -> Bool {
    switch s.value {
    case 0x00...0x1F, 0x7F...0x9F: true
    case 0x2028, 0x2029: true                       // line and paragraph separators
    case 0x200E, 0x200F, 0x061C: true               // directional marks
    case 0x202A...0x202E, 0x2066...0x2069: true     // embeddings, overrides, isolates
    default: false
    }
}
