"""The second attacker review's attacks on the admin commands, the fleet and the connection
slots (each worked before its fix): a revoke confirmed for one phone that revoked another; a
directory user taken for a look-alike local account through a case-insensitive user database;
an entry renamed to another user's name; a CA file anyone could write; one user's four phones
filling every connection slot. Kept as tests, as test_prompt_attacks.py keeps the first's."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

import pexpect
import pytest

from conftest import ROOT, USERS, wait_for
from simattacker import Key, Link
from slapd import PEOPLE
from test_fleet import admin_fleet, directory, phone_key, phone_login, use_fleet  # noqa: F401 (directory: a fixture)
from test_login_modes import key_stack

NOBODY = 65534


@pytest.fixture(scope="module")
def case_insensitive_nss():
    """An LD_PRELOAD model of a user database that matches names regardless of case (sssd with
    case_sensitive = Preserving): getpwnam("alice") gives the entry stored as "Alice"."""
    shim = os.path.join(tempfile.mkdtemp(prefix="boxkey-ci-nss-"), "ci_nss.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", shim, os.path.join(ROOT, "Tests/e2e/ci_nss.c"), "-ldl"], check=True)
    yield shim
    shutil.rmtree(os.path.dirname(shim), ignore_errors=True)


# --- 1. revoke: the phone asked about is the phone revoked ------------------------------------

def fingerprint(key):
    d = hashlib.blake2b(key, digest_size=32).digest()[:8].hex().upper()
    return "-".join(d[i:i + 4] for i in range(0, 16, 4))


def grind(prefix):
    """A 32-byte 'phone key' whose fingerprint starts with `prefix` (hex, no dashes)."""
    while True:
        key = os.urandom(32)
        if fingerprint(key).replace("-", "").startswith(prefix):
            return key.hex()


def test_a_revoke_confirmed_for_alices_phone_revokes_hers_not_a_look_alike_fleet_phone(world, directory):
    use_fleet(world, directory)
    world.start_box()
    wait_for(lambda: "fleet: read" in world.box_output(), what="the box's first read")
    world.pair_and_store()  # alice's phone, enrolled at this box (phones.json)
    alice_fp = json.loads(world.admin("phones", "list", "--json").stdout)[0]["fingerprint"]
    prefix = alice_fp.replace("-", "")[:4]

    # mallory's throw-away key, published for mallory's own account in the directory
    decoy = grind(prefix)
    assert admin_fleet(world, directory, "enrol", decoy, "--user", "bob").returncode == 0
    wait_for(lambda: "fleet: read 1 phone(s)" in world.box_output(), timeout=15, what="the box reading the decoy")

    # alice lost her phone; the admin revokes it by the first 4 hex digits, at a terminal
    cmd = [world.bins["boxkeyd"], "phones", "revoke", prefix, "--config", world.config()]
    child = pexpect.spawn(cmd[0], cmd[1:], env=world.box_env, encoding="utf-8", timeout=20)
    child.expect(r"Revoke phone (\S+) \(alice, .*\) at this box\? Its links drop at once\. \[y/N\] ")
    assert child.match.group(1) == alice_fp  # the question names alice's phone
    child.sendline("y")
    child.expect(pexpect.EOF)
    said = child.before
    print("daemon said:", said)

    # alice's phone must be refused now ...
    assert alice_fp in said, f"the daemon revoked another phone than the one the admin confirmed: {said!r}"


def test_alices_phone_is_refused_after_the_confirmed_revocation(world, directory):
    """The same, showing the consequence: the phone the admin confirmed keeps logging in."""
    use_fleet(world, directory)
    world.start_box()
    wait_for(lambda: "fleet: read" in world.box_output(), what="the box's first read")
    world.pair_and_store()
    alice_fp = json.loads(world.admin("phones", "list", "--json").stdout)[0]["fingerprint"]
    prefix = alice_fp.replace("-", "")[:4]
    assert admin_fleet(world, directory, "enrol", grind(prefix), "--user", "bob").returncode == 0
    wait_for(lambda: "fleet: read 1 phone(s)" in world.box_output(), timeout=15, what="the box reading the decoy")
    cmd = [world.bins["boxkeyd"], "phones", "revoke", prefix, "--config", world.config()]
    child = pexpect.spawn(cmd[0], cmd[1:], env=world.box_env, encoding="utf-8", timeout=20)
    child.expect(r"Revoke phone (\S+) \(alice, .*\) at this box\?")
    child.sendline("y")
    child.expect(pexpect.EOF)
    r, (code, out) = phone_login(world, "4821")
    assert not ("Logged in to box 4821 as alice" in r.stdout and code == 0), \
        f"revoked (confirmed) phone logged in as alice:\n{r.stdout}{r.stderr}\nrevoke said: {child.before}"


# --- 2. a case-insensitive user database ------------------------------------------------

def test_a_fleet_phone_for_alice_is_not_taken_for_a_box_account_named_Alice(world, directory, case_insensitive_nss):
    # The box's own users: Alice (uid 1005), no account named exactly "alice".
    with open(os.path.join(world.work, "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
        f.write("Alice:x:1005:1005:Alice (not the directory's alice):/home/Alice:/bin/sh\n")
        f.writelines(f"{u}:x:{uid}:{uid}:{u}:/home/{u}:/bin/sh\n" for u, uid in USERS.items() if u != "alice")
    world.box_env["LD_PRELOAD"] = case_insensitive_nss + ":" + world.box_env["LD_PRELOAD"]
    world.logind.add_session("43", 1005, "Alice", tty="tty2")  # Alice's console session

    # The directory's alice (no uidNumber: not a posixAccount) has her phone, enrolled by an admin.
    use_fleet(world, directory)
    world.settings["login"] = {"key_users": ["alice"], "key_services": ["boxkey-test"]}
    key = phone_key(world)
    assert admin_fleet(world, directory, "enrol", key, "--user", "alice").returncode == 0
    world.start_box()
    wait_for(lambda: "fleet: read 1 phone(s)" in world.box_output(), what="the box's read")
    assert world.phone("pair", "4821", "--box-key", world.box_key()).returncode == 0
    assert world.phone("credentials", "set", "--user", "alice", "--key-only").returncode == 0

    greeter = world.greeter("authenticate", "open_session", user="alice", session="43", auth=key_stack(world))
    r = world.phone("login", "4821", "--no-stay")
    code, out = world.finish(greeter)
    box = world.box_output()
    registered = re.findall(r".*session 43 .*registered.*", box)
    assert r.returncode != 0, (
        "the box took the directory's alice's phone for its own 'Alice' (uid 1005) and let it log in:\n"
        f"phone: {r.stdout}{r.stderr}\nprompt exit {code}\nsession lines: {registered}")


# --- 3. an entry renamed to another user's one name -------------------------------------

def test_an_entry_renamed_to_one_name_of_another_user_vouches_for_nobody(world, directory):
    use_fleet(world, directory)
    mallory_phone = phone_key(world)  # the World's phone plays mallory's
    # As in test_an_entry_that_claims_another_users_name_vouches_for_nobody, but a single name.
    # A site that names entries by cn (cn=Bob,ou=people): uid is then an ordinary attribute.
    r = directory.ldap("ldapmodify", input=f"dn: uid=bob,{PEOPLE}\nchangetype: modrdn\nnewrdn: cn=bob\ndeleteoldrdn: 1\n")
    assert r.returncode == 0, r.stderr
    r = directory.ldap("ldapmodify", input=f"dn: cn=bob,{PEOPLE}\nchangetype: modify\nreplace: uid\nuid: alice\n"
                                           f"-\nadd: boxkeyPhone\nboxkeyPhone: {mallory_phone}\n")
    assert r.returncode == 0, r.stderr
    # alice's own entry (uid=alice,ou=people) is still there, with no phone of hers yet.
    assert "dn: uid=alice," in directory.ldap("ldapsearch", "-LLL", "-b", PEOPLE, "(uid=alice)", "dn").stdout
    world.settings["login"] = {"key_users": ["alice"], "key_services": ["boxkey-test"]}
    world.start_box()
    wait_for(lambda: "fleet: read" in world.box_output(), what="the box's read")
    assert world.phone("pair", "4821", "--box-key", world.box_key()).returncode == 0
    assert world.phone("credentials", "set", "--user", "alice", "--key-only").returncode == 0
    greeter = world.greeter("authenticate", auth=key_stack(world))
    r = world.phone("login", "4821", "--no-stay")
    code, out = world.finish(greeter)
    assert r.returncode != 0, f"mallory's phone, on an entry renamed `uid: alice`, logged in as alice:\n{r.stdout}{r.stderr}"


# --- 4. a CA file anyone could write ---------------------------------------------------------

def test_a_ca_file_another_account_owns_and_anyone_may_write_is_refused(world, directory):
    ca = os.path.join(world.work, "site-ca.pem")
    shutil.copy(directory.ca, ca)
    os.chown(ca, NOBODY, NOBODY)
    os.chmod(ca, 0o666)
    use_fleet(world, directory, ca_file=ca)
    world.start_box(expect_ready=False)
    wait_for(lambda: "fleet: read" in world.box_output() or "cannot read the fleet directory" in world.box_output()
             or world.box_process.poll() is not None, timeout=20, what="the box's first read")
    out = world.box_output()
    assert "fleet: read" not in out, "the box trusted a CA file owned by uid 65534, mode 666, to say which server is the directory"


# --- 5. connection slots --------------------------------------------------------------------

def hold_slots(world, keys, stop, per_key=2):
    """Keeps `per_key` authenticated links open for each key until `stop` is set."""
    n = [0]

    def holder(key, slot):
        while not stop.is_set():
            n[0] += 1
            link = Link(world.sim, "02:AA:00:%02X:%02X:%02X" % (keys.index(key), slot, n[0] % 256))
            answer = link.handshake(key)
            if answer is None or answer[1] != 0x02:  # not a HandshakeResponse: try again shortly
                link.close()
                time.sleep(0.05)
                continue
            while not stop.is_set() and not link.closed.is_set():
                time.sleep(0.02)
            link.close()

    threads = [threading.Thread(target=holder, args=(k, s), daemon=True) for k in keys for s in range(per_key)]
    for t in threads:
        t.start()
    return threads


def test_one_users_four_phones_do_not_keep_alices_phone_out(world):
    world.start_box()
    world.pair_and_store()  # alice's phone
    keys = [Key() for _ in range(4)]
    for k in keys:  # mallory's own phones, enrolled for mallory (no one else's account involved)
        assert world.admin("phones", "enrol", k.hex, "--user", "mallory").returncode == 0

    # sanity: the hand-rolled client gets a HandshakeResponse for an enrolled key
    probe = Link(world.sim, "02:BB:00:00:00:01")
    answer = probe.handshake(keys[0])
    assert answer is not None and answer[1] == 0x02 and len(answer) == 50, answer
    probe.close()
    wait_for(lambda: world.box_output().count("timed out") >= 0, timeout=1)

    stop = threading.Event()
    threads = hold_slots(world, keys, stop)
    try:
        wait_for(lambda: "authenticated connections already" in world.box_output() or
                 world.box_output().count("handshake") >= 0, timeout=3)
        time.sleep(1.0)
        greeter = world.greeter("authenticate")  # alice at her box, pressing Enter when her push waits
        r = world.phone("login", "4821", "--no-stay", timeout=90)
        code, out = world.finish(greeter)
        refused_at_connect = world.box_output().count("authenticated connections already")
        assert r.returncode == 0 and "Logged in to box 4821 as alice" in r.stdout, (
            f"alice's enrolled phone was kept out by mallory's 4 keys (refused at connect {refused_at_connect}x):\n"
            f"{r.stdout}{r.stderr}")
    finally:
        stop.set()
        for t in threads:
            t.join(15)
