"""The fleet directory (docs/fleet.md) against a real slapd: a phone enrolled once, at one box
by its pairing code, logs in at another box that never saw it; revoking it in the directory
makes every box refuse it within [fleet] refresh_s; with the directory down a box works from
its cache until [fleet] max_stale_s, then refuses fleet phones (the password prompt always
works)."""
import base64
import copy
import hashlib
import hmac
import json
import os
import re
import subprocess
import time

import pytest

from conftest import PERSON, PASSWORD, wait_for
from slapd import ADMIN_DN, BOX_DN, BOX_PASSWORD, PEOPLE, USER_PASSWORD, Slapd

REFRESH_S = 5


@pytest.fixture
def directory(world):
    d = Slapd(world.work).start()
    yield d
    d.stop()


def use_fleet(world, directory, **extra):
    world.settings["fleet"] = directory.fleet_settings(refresh_s=REFRESH_S, **extra)


def cache_path(world):
    return os.path.join(world.settings["box"]["state_directory"], "fleet-roster.json")


def read_cache(world):
    """The roster the box cached: a seal line, then the JSON."""
    with open(cache_path(world)) as f:
        return json.loads(f.read().split("\n", 1)[1])


def seal(contents, private_key):
    """FileSeal: HMAC-BLAKE2b under a key derived from the box's private key (BoxkeyCore)."""
    file_key = hmac.new(private_key, b"boxkey file seal: fleet-roster.json", hashlib.blake2b).digest()
    return hmac.new(file_key, contents, hashlib.blake2b).hexdigest()


def write_cache(world, roster, private_key=None):
    """Writes `roster` as the cache, sealed with the box's own key (what the box itself would
    have written) or with `private_key` (another box's)."""
    if private_key is None:
        with open(os.path.join(world.settings["box"]["state_directory"], "identity")) as f:
            private_key = bytes.fromhex(re.search(r"^private-key (\w+)$", f.read(), re.M).group(1))
    contents = json.dumps(roster, sort_keys=True).encode()
    fd = os.open(cache_path(world), os.O_WRONLY | os.O_TRUNC | os.O_CREAT, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(b"boxkey-fleet-cache 1 " + seal(contents, private_key).encode() + b"\n" + contents)


def start_with_one_fleet_phone_and_alices_phone_paired(world):
    """Box 4821 started, its first read of the directory done (one phone), and the World's
    phone paired with it and holding alice's password."""
    world.start_box()
    wait_for(lambda: "fleet: read 1 phone(s)" in world.box_output(), what="the box's first read")
    assert world.phone("pair", "4821", "--box-key", world.box_key()).returncode == 0
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0


def become(world, box_id):
    """Points the World at another box (its own state, socket and log) for what follows; the
    box running before keeps running."""
    world.settings = copy.deepcopy(world.settings)
    world.settings["box"] = {"id": box_id, "state_directory": f"{world.work}/box-{box_id}"}
    world.socket = os.path.join(world.work, "run", f"pam-{box_id}.sock")
    world.settings["pam"]["socket"] = world.socket
    world.box_log = os.path.join(world.work, f"boxkeyd-{box_id}.log")


def phone_login(world, box_id, typed=None):
    """A login prompt at the World's box and `boxkey login <box_id>`: (phone, prompt) results."""
    greeter = world.greeter("authenticate", stdin=(typed + "\n") if typed is not None else PERSON)
    r = world.phone("login", box_id, "--no-stay")
    return r, world.finish(greeter)


def admin_fleet(world, directory, *args):
    return world.admin("fleet", *args, "--bind-dn", ADMIN_DN, "--password-file", directory.admin_password_file)


def enrol_at_first_box(world, directory):
    """Box 4821 publishes; alice pairs there under an admin's code for her, which enrols her
    phone at that box and in the directory. Returns the phone's key."""
    use_fleet(world, directory, publish=True)
    world.start_box()
    world.pair_and_store()
    wait_for(lambda: directory.phones("alice"), what="the phone published to the directory")
    [value] = directory.phones("alice")
    key = value.split()[0]
    assert key == phone_key(world)
    assert "published phone" in world.box_output()
    return key


def phone_key(world):
    m = re.search(r"([0-9a-f]{64})", world.phone("status").stdout)
    assert m
    return m.group(1)


def second_box(world, directory, box_id="4822", **extra):
    become(world, box_id)
    use_fleet(world, directory, **extra)
    world.start_box()
    wait_for(lambda: "fleet: read" in world.box_output(), what="box's first read of the directory")
    assert world.phone("pair", box_id, "--box-key", world.box_key()).returncode == 0


def test_a_phone_enrolled_at_one_box_logs_in_at_another_and_a_revocation_reaches_every_box(world, directory):
    key = enrol_at_first_box(world, directory)
    # Boxes 4823 and 4822 never saw this phone: the directory vouches for it at both.
    second_box(world, directory, "4823")
    third_log = world.box_log
    second_box(world, directory, "4822")
    assert "fleet: read 1 phone(s)" in world.box_output()
    r, (code, out) = phone_login(world, "4822")
    assert r.returncode == 0 and "Logged in to box 4822 as alice" in r.stdout, r.stdout + r.stderr + world.box_output()[-2000:]
    assert code == 0 and "successfully authenticated" in out, out
    status = json.loads(world.admin("status", "--json").stdout)
    assert status["fleet"]["phones"] == 1 and status["fleet"]["fresh"] and status["enrolledPhones"] == 0

    # The admin revokes it in the directory; both boxes drop it within the refresh interval.
    revoked_at = time.monotonic()
    r = admin_fleet(world, directory, "revoke", key[:12], "--user", "alice")
    assert r.returncode == 0 and "revoked" in r.stdout, r.stdout + r.stderr
    assert directory.phones("alice") == []
    for log in (world.box_log, third_log):
        wait_for(lambda: "no longer enrolled for alice in the directory" in open(log).read(), timeout=REFRESH_S + 5,
                 what=f"the box of {log} dropping the revoked phone")
    assert time.monotonic() - revoked_at <= REFRESH_S + 5
    # Refused now at 4822, and the prompt still works.
    r, (code, out) = phone_login(world, "4822", typed=PASSWORD)
    assert r.returncode != 0 and "not enrolled" in r.stderr, r.stdout + r.stderr
    assert code == 0 and "successfully authenticated" in out, out
    # 4821 enrolled it itself (by the pairing code): a directory revocation does not undo that
    # box's own enrolment; `boxkeyd phones revoke` there does (docs/fleet.md).


def test_the_directory_down_warm_cache_then_stale(world, directory):
    use_fleet(world, directory, max_stale_s=60)
    key = phone_key(world)
    assert admin_fleet(world, directory, "enrol", key, "--user", "alice", "--name", "alice's phone").returncode == 0
    r = admin_fleet(world, directory, "phones", "alice")
    assert r.returncode == 0 and key in r.stdout, r.stdout + r.stderr
    start_with_one_fleet_phone_and_alices_phone_paired(world)

    # Directory down, box restarted: it works from its cache (read seconds ago).
    directory.stop()
    world.stop_box()
    world.start_box()
    wait_for(lambda: "cannot read the fleet directory" in world.box_run_output(), what="the failed read")
    assert "from the cache" in world.box_run_output()
    r, (code, out) = phone_login(world, "4821")
    assert r.returncode == 0 and "Logged in to box 4821 as alice" in r.stdout, r.stdout + r.stderr + world.box_output()[-2000:]
    assert code == 0

    # The cache is older than max_stale_s (as if the directory had been away that long):
    # fleet phones are refused, the password prompt works.
    world.stop_box()
    roster = read_cache(world)
    roster["readAt"] = "2026-01-01T00:00:00Z"
    write_cache(world, roster)  # sealed as the box would have, an hour and more ago
    world.start_box()
    wait_for(lambda: "cannot read the fleet directory" in world.box_run_output(), what="the failed read")
    status = world.admin("status").stdout
    assert "fleet phones REFUSED" in status, status
    r, (code, out) = phone_login(world, "4821", typed=PASSWORD)
    assert r.returncode != 0 and "not enrolled" in r.stderr, r.stdout + r.stderr
    assert code == 0 and "successfully authenticated" in out, out

    # The directory is back: the box reads it within the retry and takes the phone again.
    directory.start()
    wait_for(lambda: "fleet directory answers again" in world.box_output(), timeout=20, what="the directory answering again")
    r, (code, out) = phone_login(world, "4821")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_cache_this_box_did_not_seal_vouches_for_nobody(world, directory):
    """Attack: the box restarts while the directory is down and finds a roster cache that lists
    another phone for alice: this box's cache with the key swapped in, a cache sealed by another
    box (both root's and 0600), or one at 0666 that any account could have written. None is
    used; the phone is not enrolled, and the password prompt works."""
    use_fleet(world, directory, max_stale_s=3600)
    assert admin_fleet(world, directory, "enrol", "ab" * 32, "--user", "alice", "--name", "alice's own").returncode == 0
    start_with_one_fleet_phone_and_alices_phone_paired(world)
    world.stop_box()
    directory.stop()
    with open(cache_path(world)) as f:
        seal_line, _ = f.read().split("\n", 1)
    roster = read_cache(world)
    roster["phones"][phone_key(world)] = roster["phones"].pop("ab" * 32)
    edited = json.dumps(roster, sort_keys=True)

    def edit_in_place():
        fd = os.open(cache_path(world), os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "w") as f:
            f.write(seal_line + "\n" + edited)
    def writable_by_others():
        edit_in_place()
        os.chmod(cache_path(world), 0o666)
    for how, write, says in (("this box's cache, edited", edit_in_place, "was not written by this box"),
                             ("another box's cache", lambda: write_cache(world, roster, private_key=os.urandom(32)),
                              "was not written by this box"),
                             ("a cache others could write (0666)", writable_by_others, "others may write it, so it is not used")):
        write()
        refusals = world.box_output().count(says)
        world.start_box()
        wait_for(lambda: world.box_output().count(says) > refusals, what=f"the box refusing {how}")
        assert "from the cache" not in world.box_output(), how
        r, (code, out) = phone_login(world, "4821", typed=PASSWORD)
        assert r.returncode != 0 and "not enrolled" in r.stderr, (how, r.stdout + r.stderr)
        assert code == 0 and "successfully authenticated" in out, out
        world.stop_box()


def test_crafted_phone_values_are_skipped_one_by_one_and_an_entry_holds_sixteen_phones(world, directory):
    """Values written into alice's entry by hand or by another tool: each malformed one is
    skipped and logged, her phone (the first value) still logs in, and values past sixteen good
    ones are skipped too (a box's memory is not the directory's to spend)."""
    use_fleet(world, directory)
    key = phone_key(world)
    # (slapd itself refuses what is not IA5, UTF-8 names: FleetTests covers those.)
    crafted = [key[:63] + "g", " " + "ab" * 32, "cd" * 32 + "\nuid: bob", "ef" * 32 + " " + "x" * 65, "12" * 32 + " tab\there"]
    extra = [os.urandom(32).hex() for _ in range(20)]
    values = [key + " alice's phone", *crafted, *extra]
    ldif = f"dn: uid=alice,{PEOPLE}\nchangetype: modify\nadd: boxkeyPhone\n" + "".join(
        f"boxkeyPhone:: {base64.b64encode(v.encode()).decode()}\n" for v in values)
    r = directory.ldap("ldapmodify", input=ldif)
    assert r.returncode == 0, r.stderr
    world.start_box()
    # 16 taken (her phone and 15 of the 20 keys); the 5 crafted values and the last 5 keys skipped.
    wait_for(lambda: "fleet: read 16 phone(s)" in world.box_output(), what="the box's first read")
    assert "skipped 10 value(s): not phone keys, or past 16 on one entry" in world.box_output(), world.box_output()[-2000:]
    assert world.phone("pair", "4821", "--box-key", world.box_key()).returncode == 0
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0
    r, (code, out) = phone_login(world, "4821")
    assert r.returncode == 0 and "Logged in to box 4821 as alice" in r.stdout, r.stdout + r.stderr
    assert code == 0


def test_users_cannot_enrol_their_own_phones_or_take_another_name_in_the_directory(world, directory):
    """The self-service path is a pairing code at a box: the directory's rules (docs/fleet.md)
    keep users from writing boxkeyPhone, or their login name, themselves; they may still write
    the rest of their entry, as in most directories."""
    alice = (f"uid=alice,{PEOPLE}", USER_PASSWORD)
    def modify(change):
        return directory.ldap("ldapmodify", input=f"dn: uid=alice,{PEOPLE}\nchangetype: modify\n{change}\n", bind=alice)
    assert modify("replace: description\ndescription: mine").returncode == 0  # bound as herself: the rules decide
    r = modify(f"add: boxkeyPhone\nboxkeyPhone: {'ab' * 32}")
    assert r.returncode == 50, r.stderr  # insufficientAccess
    r = modify("replace: uid\nuid: bob\nuid: alice")
    assert r.returncode == 50, r.stderr
    assert directory.phones("alice") == []


def publish_for(world, directory, user):
    """Box 4821 publishes; the World's phone pairs under an admin's code for `user`."""
    use_fleet(world, directory, publish=True)
    world.start_box()
    code = re.search(r"(\d{6})", world.admin("pair-code", "--user", user).stdout).group(1)
    r = world.pair(code)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for(lambda: "could not publish" in world.box_output() or "published phone" in world.box_output(), what="the box's publishing")


def test_a_box_writes_only_to_the_entry_named_exactly_its_user(world, directory):
    """The directory has `Carol` (an entry the server's caseIgnoreMatch finds for `carol`); the
    box's own `carol` is someone else: nothing is written to Carol's entry."""
    r = directory.ldap("ldapadd", input=f"dn: uid=Carol,{PEOPLE}\nobjectClass: inetOrgPerson\nobjectClass: boxkeyUser\nuid: Carol\ncn: Carol\nsn: Carol\n")
    assert r.returncode == 0, r.stderr
    world.add_user("carol", 1006, "carol's password")
    publish_for(world, directory, "carol")
    assert "could not publish" in world.box_output() and "looks like carol" in world.box_output(), world.box_output()[-2000:]
    assert directory.phones("Carol") == []


def test_a_box_does_not_publish_for_a_local_user_whose_uid_is_not_the_entrys(world, directory):
    r = directory.ldap("ldapmodify", input=f"dn: uid=alice,{PEOPLE}\nchangetype: modify\nadd: objectClass\nobjectClass: posixAccount\n"
                                           f"-\nadd: uidNumber\nuidNumber: 2000\n-\nadd: gidNumber\ngidNumber: 2000\n-\nadd: homeDirectory\nhomeDirectory: /home/alice\n")
    assert r.returncode == 0, r.stderr
    publish_for(world, directory, "alice")  # this box's alice is uid 1000
    assert "uidNumber 2000" in world.box_output() and "not the same person" in world.box_output(), world.box_output()[-2000:]
    assert directory.phones("alice") == []


def test_the_documented_rules_show_no_one_another_users_password_hash(world, directory):
    """Before: docs/fleet.md's rules, loaded as printed, let every user and the boxes' account
    read every userPassword (the tests had added a rule the doc lacked). The directory here runs
    the doc's block itself (slapd.documented_rules)."""
    for who in ((f"uid=bob,{PEOPLE}", USER_PASSWORD), (BOX_DN, BOX_PASSWORD)):
        r = directory.ldap("ldapsearch", "-LLL", "-b", PEOPLE, "(uid=alice)", "userPassword", "uid", bind=who)
        assert r.returncode == 0 and "uid: alice" in r.stdout, r.stdout + r.stderr  # the entry is visible...
        assert "userPassword" not in r.stdout, f"{who[0]} reads alice's password hash"  # ...its hash is not
        # ...and neither writes anything of hers but what the doc says (the boxes: boxkeyPhone).
        r = directory.ldap("ldapmodify", input=f"dn: uid=alice,{PEOPLE}\nchangetype: modify\nreplace: description\ndescription: x\n", bind=who)
        assert r.returncode == 50, r.stdout + r.stderr


def test_an_entry_that_claims_another_users_name_vouches_for_nobody(world, directory):
    """If a directory lets a user rename their entry (or holds a copy of an entry elsewhere),
    a name on two entries, or an entry with two names, enrols no phone: mallory's phone is not
    taken for alice, and alice's own phone is not taken either until the directory is fixed."""
    use_fleet(world, directory)
    mallory_phone = phone_key(world)  # the World's phone plays mallory's
    r = directory.ldap("ldapmodify", input=f"dn: uid=bob,{PEOPLE}\nchangetype: modify\nreplace: uid\nuid: alice\nuid: bob\n"
                                           f"-\nadd: boxkeyPhone\nboxkeyPhone: {mallory_phone}\n")
    assert r.returncode == 0, r.stderr
    world.settings["login"] = {"key_users": ["alice"]}
    world.start_box()
    wait_for(lambda: "fleet: read" in world.box_output(), what="the box's read")
    assert "fleet: read 0 phone(s)" in world.box_output()
    assert world.phone("pair", "4821", "--box-key", world.box_key()).returncode == 0
    assert world.phone("credentials", "set", "--user", "alice", "--key-only").returncode == 0
    r, (code, out) = phone_login(world, "4821", typed=PASSWORD)
    assert r.returncode != 0 and "not enrolled" in r.stderr, r.stdout + r.stderr
    assert code == 0 and "successfully authenticated" in out, out


@pytest.mark.parametrize("name", ["Alice", "\uff41\uff4c\uff49\uff43\uff45", "alice\u0301"], ids=["case", "fullwidth", "combining"])
def test_a_look_alike_local_name_cannot_publish_onto_alices_entry(world, directory, name):
    """Before: a local account `Alice` (or fullwidth) at a publishing box enrolled her own phone;
    the box searched (uid=Alice), slapd's caseIgnoreMatch found alice's entry, and her phone
    was written there, to log in as alice at every box in key mode. Now the box writes only to
    an entry named exactly the local name, and takes no name adduser would not make."""
    world.add_user(name, 1005, "look-alike password")
    use_fleet(world, directory, publish=True)
    world.start_box()
    code = re.search(r"(\d{6})", world.admin("pair-code", "--user", name).stdout).group(1)
    r = world.pair(code, who="mallory")
    assert r.returncode == 0, r.stdout + r.stderr  # enrolled at this box for her own account
    wait_for(lambda: "could not publish" in world.box_output(), what="the box's refusal to publish")
    assert "is not a name the fleet takes" in world.box_output()
    assert directory.phones("alice") == []


def test_a_box_admin_revokes_a_phone_known_only_from_the_directory(world, directory):
    """`boxkeyd phones revoke` at a box works for a fleet phone too, and holds while the
    directory still lists it (a lost phone during a directory outage)."""
    use_fleet(world, directory)
    key = phone_key(world)
    assert admin_fleet(world, directory, "enrol", key, "--user", "alice").returncode == 0
    world.start_box()
    wait_for(lambda: "fleet: read 1 phone(s)" in world.box_output(), what="the box's read")
    assert world.phone("pair", "4821", "--box-key", world.box_key()).returncode == 0
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0
    fingerprint = re.search(r"fingerprint: (\S+)", world.phone("status").stdout).group(1)
    r = world.admin("phones", "revoke", "--yes", fingerprint[:9])
    assert r.returncode == 0 and "revoked" in r.stdout, r.stdout + r.stderr
    r, (code, out) = phone_login(world, "4821", typed=PASSWORD)
    assert r.returncode != 0 and "revoked" in r.stderr, r.stdout + r.stderr
    assert code == 0 and "successfully authenticated" in out, out


@pytest.mark.parametrize("uri, says", [("ldap://127.0.0.1/", "never read in clear"),  # ldap:// without StartTLS
                                       ("ldaps://127.0.0.1:1/,ldap://127.0.0.1/", "one URI")])  # libldap would try the second
def test_a_bad_fleet_section_is_refused_with_the_reason(world, uri, says):
    world.settings["fleet"] = {"uri": uri, "base": PEOPLE}
    r = subprocess.run([world.bins["boxkeyd"], "run", "--check-config", "--config", world.config()], capture_output=True, text=True)
    assert r.returncode == 78 and says in r.stderr, r.stderr


def test_a_directory_with_an_untrusted_certificate_is_not_read(world, directory):
    use_fleet(world, directory, ca_file="/etc/ssl/certs/ca-certificates.crt")
    world.start_box()
    wait_for(lambda: "cannot read the fleet directory" in world.box_output(), what="the refused read")
    assert re.search(r"StartTLS failed|certificate", world.box_output()), world.box_output()[-2000:]
    assert "fleet phones REFUSED" in world.admin("status").stdout


def test_a_phone_that_trusts_the_fleet_key_takes_a_certified_box_and_refuses_it_once_revoked(world, directory):
    """Box certificates: the admin makes a fleet key, certifies box 4821, and signs the
    revocation list into the directory; a phone that trusts the fleet key logs in at the box
    without pairing. Once the box's certificate is revoked, the phone refuses the box (no
    credentials sent), and the prompt still takes the password."""
    fleet_key = os.path.join(world.work, "fleet.key")
    def offline(*args):  # on the admin's machine: the fleet key never goes to a box
        return subprocess.run([world.bins["boxkeyd"], "fleet", *args], capture_output=True, text=True, timeout=20)
    r = offline("key", "--out", fleet_key)
    assert r.returncode == 0, r.stdout + r.stderr
    public = re.search(r"public key .*: ([0-9a-f]{64})", r.stdout).group(1)
    assert oct(os.stat(fleet_key).st_mode & 0o777) == "0o600"
    use_fleet(world, directory)
    r = admin_fleet(world, directory, "revoke-box", "--fleet-key", fleet_key)
    assert r.returncode == 0 and "revocation list 1: 0 certificate(s) revoked" in r.stdout, r.stdout + r.stderr
    key = phone_key(world)
    assert admin_fleet(world, directory, "enrol", key, "--user", "alice").returncode == 0
    world.start_box()
    r = offline("certify", "--fleet-key", fleet_key, "--box-key", world.box_key(), "--box-id", "4821")
    assert r.returncode == 0, r.stdout + r.stderr
    certificate = r.stdout.strip()
    # A certificate for another box is refused at installation.
    r2 = offline("certify", "--fleet-key", fleet_key, "--box-key", "ab" * 32, "--box-id", "4821")
    assert world.admin("fleet", "install-certificate", r2.stdout.strip()).returncode != 0
    r = world.admin("fleet", "install-certificate", certificate)
    assert r.returncode == 0 and "installed certificate" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: "fleet: serving certificate" in world.box_output(), timeout=REFRESH_S + 5,
             what=lambda: "the box serving its certificate:\n" + world.box_output()[-1500:])
    serial = re.search(r"serving certificate ([0-9a-f]+)", world.box_output()).group(1)
    doctor = world.admin("doctor").stdout
    assert re.search(r"ok\s+fleet directory", doctor) and re.search(r"ok\s+fleet certificate.*revocation list 1 valid for 29 more day", doctor), doctor

    # Not trusting the fleet key: the box is not paired, nothing is sent.
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0
    r = world.phone("login", "4821", "--no-stay")
    assert r.returncode != 0 and "not paired" in r.stderr, r.stdout + r.stderr
    # Trusting it: logged in, no pairing.
    r = world.phone("fleet", "trust", public)
    assert r.returncode == 0, r.stdout + r.stderr
    r, (code, out) = phone_login(world, "4821")
    assert r.returncode == 0 and "Logged in to box 4821 as alice" in r.stdout, r.stdout + r.stderr + world.box_output()[-2000:]
    assert code == 0
    assert "revocation list 1 seen" in world.phone("fleet").stdout

    # Revoked: the box serves the list that names it; the phone refuses the box.
    r = admin_fleet(world, directory, "revoke-box", serial, "--fleet-key", fleet_key)
    assert r.returncode == 0 and "revocation list 2: 1 certificate(s) revoked" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: "certificate is REVOKED" in world.box_output(), timeout=REFRESH_S + 5, what="the box reading the new list")
    r, (code, out) = phone_login(world, "4821", typed=PASSWORD)
    assert r.returncode != 0 and "was revoked by the fleet" in r.stderr and "No credentials were sent" in r.stderr, r.stdout + r.stderr
    assert code == 0 and "successfully authenticated" in out, out
    assert "login attempt" not in world.box_output().split("certificate is REVOKED")[1]

    # The review's attacks on the phone's side. An agent that started before the fleet key was
    # forgotten must not keep trusting it, nor fall back to the pinned path for the box; the
    # box taken on the key's certificate goes with the key.
    r = admin_fleet(world, directory, "revoke-box", "--remove", serial, "--fleet-key", fleet_key)
    assert r.returncode == 0 and "revocation list 3: 0 certificate(s) revoked" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: "revocation list 3" in world.box_output(), timeout=REFRESH_S + 5, what="the box serving list 3")
    assert world.phone("agent", "start").returncode == 0
    try:
        r, (code, _) = phone_login(world, "4821")
        assert r.returncode == 0 and code == 0, r.stdout + r.stderr
        fingerprint = re.search(r"([0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4})", world.phone("fleet").stdout).group(1)
        r = world.phone("fleet", "forget", fingerprint)
        assert r.returncode == 0 and "forgot the boxes it certified: 4821" in r.stdout, r.stdout + r.stderr
        r, (code, out) = phone_login(world, "4821", typed=PASSWORD)
        assert r.returncode != 0 and "is not paired" in r.stderr, r.stdout + r.stderr
        assert code == 0 and "successfully authenticated" in out, out
        assert world.phone("fleet").stdout.startswith("This phone trusts no fleet key")
    finally:
        world.phone("agent", "stop", timeout=20)

    # revoke-box builds only on a list its own fleet key signed: a list another key signed (or
    # anyone who can write the entry) cannot un-revoke a box through the admin's next signing.
    other_key = os.path.join(world.work, "other.key")
    assert offline("key", "--out", other_key).returncode == 0
    assert offline("key", "--out", other_key).returncode != 0  # never overwritten
    r = admin_fleet(world, directory, "revoke-box", "--fleet-key", other_key)
    assert r.returncode != 0 and "not signed by this fleet key" in r.stderr, r.stdout + r.stderr
