#!/usr/bin/env python3
"""The fleet directory's figures (docs/fleet.md): a throwaway slapd with 10,000 users, 2,000 of
them with a phone, and a real boxkeyd (simulated radio) reading it. Prints: the roster's read
time and requests, login time with the box's cache cold (just started, no cache file) and
warm, the directory lookups each login makes, and how long a revocation takes to reach the box;
then many boxes against the one slapd: revocation → every box has dropped the phone (p50/p99),
following the directory (RFC 4533, syncprov) and reading it whole every refresh_s, and the
directory's CPU per idle minute under each.
Usage: fleet_bench.py BIN_DIR PAM_MODULE [--short]"""
import copy
import os
import re
import statistics
import subprocess
import sys
import tempfile
import shutil
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "Tests", "e2e"))
from conftest import PASSWORD, USERS, Logind, World, toml_value, wait_for  # noqa: E402
from slapd import ADMIN_DN, BOX_DN, BOX_PASSWORD, PEOPLE, Slapd  # noqa: E402

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
        world.settings["fleet"] = directory.fleet_settings(refresh_s=REFRESH_S, follow=False)

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
        print(f"  revocation → box drops the phone, box reading whole every refresh_s = {REFRESH_S} (follow = false): " + ", ".join(f"{p:.1f} s" for p in propagation)
              + f"; bound: refresh_s + one read")
        many_boxes(world, directory, alice_key, short)
    finally:
        world.close()
        if directory:
            directory.stop()
        logind.stop()
        shutil.rmtree(work, ignore_errors=True)


def many_boxes(world, directory, key, short):
    """N boxkeyd against the one slapd, waiting for Bluetooth (no bluetoothd on their bus), so
    only their fleet service works: the directory's CPU over an idle window, then revocations
    (ldapmodify) → the time until each box's log says it dropped the phone; for boxes that
    follow the directory and for boxes that read it whole every refresh_s (the default 60 s)."""
    count, window, rounds = (10, 10, 2) if short else (100, 60, 10)
    [value] = [v for v in directory.phones("alice") if v.startswith(key)]
    revoke = f"dn: uid=alice,{PEOPLE}\nchangetype: modify\ndelete: boxkeyPhone\nboxkeyPhone: {value}\n"
    enrol = revoke.replace("delete:", "add:")
    print(f"  {count} boxes against this slapd ({'short' if short else 'full'} mode: {window} s idle window, {rounds} revocations):")
    for follow in (True, False):
        # Reading whole: the window is one refresh cycle, every box's read in it once.
        boxes = start_boxes(world, directory, count, follow, refresh_s=60 if follow else window)
        try:
            wait_for(lambda: all("fleet: read 2000 phone(s)" in read(log) for _, log, _ in boxes), timeout=300, interval=0.5,
                     what="every box's first read")
            time.sleep(2)
            cpu_before, searches_before = slapd_cpu(directory), directory.searches()
            time.sleep(window)
            cpu = (slapd_cpu(directory) - cpu_before) * 60 / window
            searches = (directory.searches() - searches_before) * 60 / window
            samples = []
            if follow:
                for _ in range(rounds):
                    samples += revocation(directory, boxes, revoke, enrol)
            samples.sort()
            if follow:
                print(f"    following (syncprov, refresh_s = 60): directory CPU {cpu * 1000:.0f} ms per idle minute, {searches:.0f} searches per minute")
            else:
                # One cycle's cost: a minute's at the default refresh_s = 60.
                print(f"    reading whole every refresh_s (follow = false): directory CPU {cpu * window / 60 * 1000:.0f} ms per refresh cycle "
                      f"(= per minute at the default 60 s), {searches * window / 60:.0f} searches")
            if samples:
                p = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]
                print(f"      revocation (ldapmodify started) → box dropped the phone, {len(samples)} box-revocations: "
                      f"p50 {p(0.5) * 1000:.0f} ms, p99 {p(0.99) * 1000:.0f} ms, max {samples[-1] * 1000:.0f} ms")
        finally:
            for process, _, _ in boxes:
                process.terminate()
            for process, _, _ in boxes:
                process.wait(20)
            shutil.rmtree(os.path.dirname(os.path.dirname(boxes[0][2])), ignore_errors=True)
    samples = fan_out(directory, count, rounds, revoke, enrol)
    p = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]
    print(f"    the directory's side: revocation → each of {count} bare consumers (ldapsearch -E sync=rp) has it, {len(samples)} samples: "
          f"p50 {p(0.5) * 1000:.0f} ms, p99 {p(0.99) * 1000:.0f} ms")
    start = time.monotonic()
    assert directory.ldap("ldapsearch", "-LLL", "-b", PEOPLE, "(uid=alice)", "1.1").returncode == 0
    print(f"    (one ldapsearch process, TLS and bind included, takes {(time.monotonic() - start) * 1000:.0f} ms here)")


def fan_out(directory, count, rounds, revoke, enrol):
    """The same revocations to `count` consumers that do nothing with them (OpenLDAP's ldapsearch
    following the same filter): how long slapd takes to tell them all, apart from what the
    boxes do with it. Boxes on their own machines see about this plus their own ~20 ms."""
    env = dict(os.environ, LDAPTLS_CACERT=directory.ca)
    consumers, heard, lock = [], {}, threading.Lock()

    def listen(i, process):
        for line in process.stdout:
            if line.startswith("dn: uid=alice,"):
                with lock:
                    heard.setdefault(i, time.monotonic())

    for i in range(count):
        process = subprocess.Popen(["ldapsearch", "-ZZ", "-H", directory.uri, "-x", "-D", BOX_DN, "-w", BOX_PASSWORD, "-LLL",
                                    "-b", PEOPLE, "-E", "!sync=rp", "(&(objectClass=boxkeyUser)(boxkeyPhone=*))", "uid", "uidNumber", "boxkeyPhone"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        consumers.append(process)
        threading.Thread(target=listen, args=(i, process), daemon=True).start()
    try:
        time.sleep(10)  # their refreshes (2,000 entries each) done
        samples = []
        for _ in range(rounds):
            with lock:
                heard.clear()
            start = time.monotonic()
            assert directory.ldap("ldapmodify", input=revoke).returncode == 0
            wait_for(lambda: len(heard) == count, timeout=30, interval=0.01, what="every consumer hearing of it")
            samples += [t - start for t in heard.values()]
            assert directory.ldap("ldapmodify", input=enrol).returncode == 0
            time.sleep(1)
        return sorted(samples)
    finally:
        for process in consumers:
            process.kill()
            process.wait()


def start_boxes(world, directory, count, follow, refresh_s):
    # State on tmpfs: a box writes its cache (fsync) right after it drops a revoked phone; on
    # their own machines that is each box's own disk, here 100 boxes would queue on one.
    state = tempfile.mkdtemp(prefix="boxkey-bench-", dir="/dev/shm")
    boxes = []
    for i in range(count):
        box_id = f"{6000 + i}"
        settings = copy.deepcopy(world.settings)
        settings["box"] = {"id": box_id, "state_directory": os.path.join(state, box_id)}
        settings["pam"]["socket"] = os.path.join(world.work, "run", f"pam-{box_id}.sock")
        settings["radio"] = {"backend": "bluez", "adapter": ""}
        settings["fleet"] = directory.fleet_settings(follow=follow, refresh_s=refresh_s)
        path = os.path.join(world.work, f"boxkeyd-{box_id}.conf")
        with open(path, "w") as f:
            f.write("".join(f"[{section}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()) for section, values in settings.items()))
        log = os.path.join(world.work, f"boxkeyd-{box_id}.log")
        boxes.append((subprocess.Popen([world.bins["boxkeyd"], "--config", path], env=world.box_env,
                                       stdout=open(log, "w"), stderr=subprocess.STDOUT), log, settings["box"]["state_directory"] + "/x"))
    return boxes


def read(path):
    with open(path) as f:
        return f.read()


def slapd_cpu(directory):
    """slapd's user + system CPU so far, in seconds."""
    fields = open(f"/proc/{directory.process.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def revocation(directory, boxes, revoke, enrol):
    """One revocation: seconds from starting ldapmodify until each box's log says it dropped the
    phone; then the phone enrolled again and back at every box."""
    text = "no longer enrolled for alice"
    before = [read(log).count(text) for _, log, _ in boxes]
    sizes = [os.path.getsize(log) for _, log, _ in boxes]
    start = time.monotonic()
    r = directory.ldap("ldapmodify", input=revoke)
    assert r.returncode == 0, r.stderr
    seen = [None] * len(boxes)
    deadline = start + 30
    while None in seen and time.monotonic() < deadline:
        for i, (_, log, _) in enumerate(boxes):
            if seen[i] is None and os.path.getsize(log) != sizes[i]:
                sizes[i] = os.path.getsize(log)
                if read(log).count(text) > before[i]:
                    seen[i] = time.monotonic() - start
        time.sleep(0.002)
    assert None not in seen, f"{seen.count(None)} box(es) did not drop the phone within 30 s"
    counts = [read(log).count("fleet: read 2000 phone(s)") for _, log, _ in boxes]
    assert directory.ldap("ldapmodify", input=enrol).returncode == 0
    wait_for(lambda: all(read(log).count("fleet: read 2000 phone(s)") > n for (_, log, _), n in zip(boxes, counts)), timeout=30,
             interval=0.05, what="the phone back at every box")
    # Each box writes its cache a second after a change: on separate machines that costs
    # nothing to the next change, here 100 boxes share 2 cores, so the next round waits for it.
    time.sleep(2.5)
    return seen


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
