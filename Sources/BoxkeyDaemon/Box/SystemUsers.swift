import Glibc

/// The system's user database, as the box asks it (tests give the box a table instead).
public enum SystemUsers {
    static let rootRefusal = "phones are not enrolled for root at this box: log in as yourself and use sudo, or set [enrolment] root = true in boxkeyd.conf"

    /// The name the user database gives for `user` (nil: none), to tell an exact match from a
    /// case-insensitive one.
    static func accountName(_ user: String) -> String? {
        guard let pw = getpwnam(user) else { return nil }
        return String(cString: pw.pointee.pw_name)
    }

    public static let uid: @Sendable (String) -> UInt32? = { user in
        guard let pw = getpwnam(user) else { return nil }
        return UInt32(pw.pointee.pw_uid)
    }
}
