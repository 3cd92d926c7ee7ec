import FoundationEssentials

/// Parents and children of processes, as the kernel has them (/proc/PID/stat).
enum ProcessTree {
    /// The parent of `pid`, nil if it is gone.
    static func parent(of pid: Int32) -> Int32? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let end = stat.lastIndex(of: ")") else { return nil }
        // "PID (comm) STATE PPID ...": comm may hold spaces and parentheses; it ends at the last ")".
        let fields = stat[stat.index(after: end)...].split(separator: " ")
        return fields.count > 1 ? Int32(fields[1]) : nil
    }

    static func children(of pid: Int32) -> [Int32] {
        ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { entry in
            guard let child = Int32(entry), parent(of: child) == pid else { return nil }
            return child
        }
    }
}
