#!/usr/bin/env python3
"""What pam_boxkey.so costs a PAM program that merely has it in its stack: `su -c true`, as
root, with the module first in su's auth and session stacks (no daemon: it steps aside), and
without it. Prints the median and p90 wall time and the process's peak RSS for each.

    Benchmarks/su_bench.py [--runs N] MODULE [LABEL=MODULE ...]

Root only. It runs in a mount namespace of its own, where its su stack is bind-mounted over
/etc/pam.d/su: the machine's file is never edited, and nothing outside sees the change."""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

SU_STACK = "/etc/pam.d/su"


def run_su(runs):
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(["su", "-c", "true", "root"], stdin=subprocess.DEVNULL, check=True)
        walls.append((time.perf_counter() - start) * 1000)
    walls.sort()
    return statistics.median(walls), walls[int(len(walls) * 0.9)]


def peak_rss_kib(runs=20):
    """su's own peak RSS, through GNU time: a child forked from this Python process would
    carry the interpreter's high-water mark across exec."""
    peaks = []
    for _ in range(runs):
        r = subprocess.run(["/usr/bin/time", "-f", "%M", "su", "-c", "true", "root"], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, check=True)
        peaks.append(int(r.stderr.strip().splitlines()[-1]))
    return statistics.median(peaks)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("modules", nargs="+", help="MODULE or LABEL=MODULE")
    args = parser.parse_args()
    if not os.path.exists("/usr/bin/time"):
        subprocess.run(["apt-get", "install", "-y", "-q", "time"], check=True, capture_output=True)
    if os.geteuid() != 0:
        sys.exit("su_bench: run as root (su, and a mount namespace)")
    if os.environ.get("SU_BENCH_NAMESPACE") != "1":
        os.environ["SU_BENCH_NAMESPACE"] = "1"
        os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable, *sys.argv])
    original = open(SU_STACK).read()
    stack = tempfile.NamedTemporaryFile(prefix="su-pam-", suffix=".conf", delete=False)
    stack.close()
    try:
        rows = [("no pam_boxkey", None)]
        for spec in args.modules:
            label, _, path = spec.rpartition("=")
            rows.append((label or "pam_boxkey.so", os.path.abspath(path)))
        print(f"su -c true as root, {args.runs} runs each (module first in auth and session, no daemon):")
        for label, module in rows:
            with open(stack.name, "w") as f:
                if module:
                    f.write(f"auth optional {module} socket=/run/boxkey-su-bench-none.sock\n"
                            f"session optional {module} socket=/run/boxkey-su-bench-none.sock\n")
                f.write(original)
            subprocess.run(["mount", "--bind", stack.name, SU_STACK], check=True)
            try:
                run_su(5)  # warm the page cache
                median, p90 = run_su(args.runs)
                rss = peak_rss_kib()
            finally:
                subprocess.run(["umount", SU_STACK], check=True)
            size = os.path.getsize(module) // 1024 if module else 0
            print(f"  {label:<28} {size:>6} KiB  wall median {median:6.2f} ms  p90 {p90:6.2f} ms  peak RSS {rss / 1024:5.1f} MiB")
    finally:
        os.unlink(stack.name)


if __name__ == "__main__":
    main()
