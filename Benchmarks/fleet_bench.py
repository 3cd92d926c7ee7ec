#!/usr/bin/env python3
"""The fleet directory's figures (docs/fleet.md): a throwaway slapd with 10,000 users, 2,000 of
them with a phone, and a real boxkeyd (simulated radio) reading it. Prints: the roster's read
time and requests, login time with the box's cache cold (just started, no cache file) and
warm, the directory lookups each login makes, and how long a revocation takes to reach the box.
Usage: fleet_bench.py BIN_DIR PAM_MODULE [--short]"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import shutil
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "Tests", "e2e"))
from conftest import PASSWORD, USERS, Logind, World, wait_for  # noqa: E402
from slapd import ADMIN_DN, PEOPLE, Slapd  # noqa: E402

USERS_IN_DIRECTORY = 10_000
PHONES = 2_000
REFRESH_S = 10


def main():
    bin_dir, module = sys.argv[1], sys.argv[2]
    short = "--short" in sys.argv
    rounds = 3 if short else 10
    bins = {"boxkeyd": os.path.join(bin_dir, "boxkeyd"), "boxkey": os.path.join(bin_dir, "boxkey"), "module": module, "harness": ""}
    work = tempfile.mkdtemp(prefix="boxkey-fleet-bench-")
    logind = Logind(work)
    logind.add_session("42", USERS["alice"], "alice", tty="tty1")
    world = World(bins, work, logind)
    # The release boxkeyd (static Swift runtime) does not start under pam_wrapper's preload;
    # directory-enrolled phones never reach the box's own PAM service, so it runs without.
    world.box_env = {k: v for k, v in world.box_env.items() if not k.startswith("PAM_WRAPPER")}
    world.box_env["LD_PRELOAD"] = "libnss_wrapper.so"
    directory = None
    try:
        alice_key = re.search(r"([0-9a-f]{64})", world.phone("status").stdout).group(1)
        directory = Slapd(work, users=("alice", "bob"), extra_users=USERS_IN_DIRECTORY - 2)
        phones_ldif = [f"dn: uid=alice,{PEOPLE}\nchangetype: modify\nadd: boxkeyPhone\nboxkeyPhone: {alice_key} alice's phone\n"]
        for n in range(PHONES - 1):
            phones_ldif.append(f"dn: uid=user{n:05d},{PEOPLE}\nchangetype: modify\nadd: boxkeyPhone\nboxkeyPhone: {os.urandom(32).hex()}\n")
        directory.start()
        r = directory.ldap("ldapmodify", input="\n".join(phones_ldif))
        assert r.returncode == 0, r.stderr
        world.settings["fleet"] = directory.fleet_settings(refresh_s=REFRESH_S)

        # The roster as a box reads it (boxkeyd fleet check, the boxes' account).
        reads = []
        for _ in range(rounds):
            out = world.admin("fleet", "check").stdout
            m = re.search(r"(\d+) phone\(s\) of (\d+) user\(s\) in (\d+) ms, (\d+) request", out)
            assert m, out
            reads.append(int(m.group(3)))
        requests = int(m.group(4))
        assert int(m.group(1)) == PHONES, out

        # Cold: the box starts with no cache; the first login after it advertises.
        world.start_box()
        wait_for(lambda: "fleet: read" in world.box_output(), timeout=30, what="the first read")
        assert world.phone("pair", "4821", "--box-key", world.box_key()).returncode == 0
        assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0
        world.stop_box()
        os.remove(os.path.join(world.settings["box"]["state_directory"], "fleet-roster.json"))
        world.start_box()
        cold_ms, cold_lookups = login(world, directory)
        box_read = re.search(r"fleet: read \d+ phone\(s\) from \S+ in ([\d.]+) s \((\d+) request", world.box_output())

        # Warm: more logins on the same box.
        warm = [login(world, directory) for _ in range(rounds)]
        warm_ms = [ms for ms, _ in warm]
        warm_lookups = sum(n for _, n in warm)

        # Revocation: removed in the directory at a random moment of the refresh cycle.
        propagation = []
        for i in range(min(rounds, 3)):
            time.sleep(1.7 * (i + 1) % REFRESH_S)
            before = world.box_output().count("no longer enrolled")
            start = time.monotonic()
            r = world.admin("fleet", "revoke", alice_key[:16], "--user", "alice", "--bind-dn", ADMIN_DN, "--password-file", directory.admin_password_file)
            assert r.returncode == 0, r.stdout + r.stderr
            wait_for(lambda: world.box_output().count("no longer enrolled") > before, timeout=REFRESH_S + 10, interval=0.05, what="the revocation")
            propagation.append(time.monotonic() - start)
            r = world.admin("fleet", "enrol", alice_key, "--user", "alice", "--bind-dn", ADMIN_DN, "--password-file", directory.admin_password_file)
            assert r.returncode == 0, r.stdout + r.stderr
            wait_for(lambda: "taken" in world.admin("status").stdout and "1999" not in world.admin("status").stdout,
                     timeout=REFRESH_S + 10, interval=0.2, what="the phone back")
        rss = int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{world.box_process.pid}/status").read()).group(1)) / 1024

        # The same logins on the same box without [fleet] (the phone enrolled at the box).
        world.stop_box()
        del world.settings["fleet"]
        world.start_box()
        r = world.admin("phones", "enrol", alice_key, "--user", "alice")
        assert r.returncode == 0, r.stdout + r.stderr
        local_ms = [login(world, directory)[0] for _ in range(rounds)]

        print()
        print(f"Fleet directory (slapd on this machine, {USERS_IN_DIRECTORY:,} users, {PHONES:,} with a phone; {'short' if short else 'full'} mode)")
        print(f"  roster read (boxkeyd fleet check), median of {rounds}: {statistics.median(reads)} ms, {requests} paged request(s)")
        if box_read:
            print(f"  roster read by the box at start: {float(box_read.group(1)) * 1000:.0f} ms, {box_read.group(2)} request(s); box RSS after: {rss:.1f} MiB")
        print(f"  login, cold cache (box just started, no cache file): {cold_ms} ms; directory lookups during it: {cold_lookups}")
        print(f"  login, warm cache, median of {rounds}: {statistics.median(warm_ms)} ms (max {max(warm_ms)}); directory lookups in all: {warm_lookups}")
        print(f"  login, the same box without [fleet] (phone enrolled at the box), median of {rounds}: {statistics.median(local_ms)} ms")
        print(f"  revocation → box drops the phone (refresh_s = {REFRESH_S}): " + ", ".join(f"{p:.1f} s" for p in propagation)
              + f"; bound: refresh_s + one read")
    finally:
        world.close()
        if directory:
            directory.stop()
        logind.stop()
        shutil.rmtree(work, ignore_errors=True)


def login(world, directory):
    """One login at a waiting prompt: the phone's reported time, and the directory searches
    slapd served meanwhile other than the periodic roster reads (a box answers logins from its
    roster: none expected)."""
    greeter = world.greeter("authenticate")
    before = directory.searches(roster=False)
    r = world.phone("login", "4821", "--no-stay")
    after = directory.searches(roster=False)
    code, out = world.finish(greeter)
    assert r.returncode == 0 and code == 0, r.stdout + r.stderr + out + world.box_output()[-2000:]
    ms = int(re.search(r"\((\d+) ms\)", r.stdout).group(1))
    return ms, after - before


if __name__ == "__main__":
    main()
