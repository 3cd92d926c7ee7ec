"""The box as admins run it: files another account could have written are never believed
(the daemon stops with exit 78, naming the file and what to run, and doctor says the same)."""
import json
import re
import os
import subprocess

import pytest

from conftest import SLOW

NOBODY = 65534


def enrolled_box(world):
    """A box with alice's phone enrolled (so phones.json exists), stopped."""
    world.start_box()
    world.pair_and_store()
    world.stop_box()
    return os.path.join(world.work, "box")


def refused(world, path, fix):
    before = len(world.box_output())
    p = world.start_box(expect_ready=False)
    assert p.wait(20 * SLOW) == 78, world.box_output()[-1500:]
    out = world.box_output()[before:]
    assert path in out and fix in out, out[-1500:]
    assert "advertising box" not in out


@pytest.mark.parametrize("what", ["phones.json 0666", "phones.json another uid's", "state folder 0777",
                                  "identity 0644", "escrow.json 0644", "phones.json a link"])
def test_a_state_file_others_could_write_stops_the_daemon(world, what):
    """Before: with the state folder at 0755 and phones.json at 0666 (a restore, an umask slip),
    another local user added her own phone key for alice; the daemon tightened the folder and
    loaded her record without a word, and in key mode she logged in as alice."""
    state = enrolled_box(world)
    phones = os.path.join(state, "phones.json")
    if what == "phones.json 0666":
        os.chmod(state, 0o755)
        os.chmod(phones, 0o666)
        records = json.load(open(phones))
        records.append(dict(records[0], key="ab" * 32, name="mallory's phone"))  # what the other user wrote
        with open(phones, "w") as f:
            json.dump(records, f)
        refused(world, phones, "chmod 600")
    elif what == "phones.json another uid's":
        os.chown(phones, NOBODY, NOBODY)
        refused(world, phones, f"chown {os.geteuid()}")
    elif what == "state folder 0777":
        os.chmod(state, 0o777)
        refused(world, state, "chmod 700")
    elif what == "identity 0644":
        identity = os.path.join(state, "identity")
        os.chmod(identity, 0o644)
        refused(world, identity, "chmod 600")
    elif what == "escrow.json 0644":
        escrow = os.path.join(state, "escrow.json")
        with open(os.open(escrow, os.O_WRONLY | os.O_CREAT, 0o644), "w") as f:
            f.write("[]")
        os.chmod(escrow, 0o644)
        refused(world, escrow, "chmod 600")
    else:
        real = os.path.join(world.work, "elsewhere.json")
        os.rename(phones, real)
        os.symlink(real, phones)
        refused(world, phones, "symbolic link")


@pytest.mark.parametrize("how", ["writable by all", "another uid's"])
def test_a_configuration_others_could_write_is_not_read(world, how):
    config = world.config()
    if how == "writable by all":
        os.chmod(config, 0o666)
        fix = "chmod go-w"
    else:
        os.chown(config, NOBODY, NOBODY)
        fix = "chown root:"
    p = world.start_box(expect_ready=False)
    assert p.wait(20 * SLOW) == 78
    assert fix in world.box_output(), world.box_output()
    r = world.admin("doctor")
    assert r.returncode == 1 and "FAILED" in r.stdout and fix in r.stdout, r.stdout


def test_doctor_names_a_lax_state_file(world):
    state = enrolled_box(world)
    os.chmod(os.path.join(state, "phones.json"), 0o664)
    r = world.admin("doctor")
    line = next((l for l in r.stdout.splitlines() if "phones.json" in l), "")
    assert r.returncode == 1 and "mode 664" in line and "chmod 600" in line, r.stdout


def test_revoke_names_the_phone_and_asks(world):
    """Before: `boxkeyd phones revoke 5` revoked by a one-character prefix without a word."""
    import pexpect
    world.start_box()
    world.pair_and_store()
    phones = json.loads(world.admin("phones", "list", "--json").stdout)
    fingerprint = phones[0]["fingerprint"]
    r = world.admin("phones", "revoke", fingerprint[:1])
    assert r.returncode == 64 and "at least 4 hex digits" in r.stderr, r.stdout + r.stderr
    r = world.admin("phones", "revoke", fingerprint[:4])  # no terminal: no answer, no revocation
    assert r.returncode == 1 and "add --yes" in r.stderr and fingerprint in r.stderr, r.stdout + r.stderr
    cmd = [world.bins["boxkeyd"], "phones", "revoke", fingerprint[:4], "--config", world.config()]
    child = pexpect.spawn(cmd[0], cmd[1:], env=world.box_env, encoding="utf-8", timeout=20)
    child.expect(r"Revoke phone (\S+) \(alice, .*\) at this box\? Its links drop at once\. \[y/N\] ")
    assert child.match.group(1) == fingerprint
    child.sendline("n")
    child.expect("not revoked")
    child.expect(pexpect.EOF)
    assert not json.loads(world.admin("phones", "list", "--json").stdout)[0].get("revokedAt")
    child = pexpect.spawn(cmd[0], cmd[1:], env=world.box_env, encoding="utf-8", timeout=20)
    child.expect(r"\[y/N\] ")
    child.sendline("y")
    child.expect(f"revoked {fingerprint}")
    child.expect(pexpect.EOF)
    assert json.loads(world.admin("phones", "list", "--json").stdout)[0].get("revokedAt")


def test_no_phone_is_enrolled_for_root_unless_the_config_says_so(world):
    """Before: `boxkeyd pair-code --user root` was accepted: a code read off the admin's screen
    made a phone a root key."""
    world.start_box()
    for args in (("pair-code", "--user", "root"), ("phones", "enrol", "ab" * 32, "--user", "root")):
        r = world.admin(*args)
        assert r.returncode != 0 and "not enrolled for root" in r.stderr and "[enrolment] root = true" in r.stderr, r.stdout + r.stderr
    assert world.admin("pair-code", "--user", "alice").returncode == 0


def json_keys(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield f"{prefix}{k}"
            yield from json_keys(v, f"{prefix}{k}.")
    elif isinstance(value, list):
        for v in value:
            yield from json_keys(v, prefix)


def test_every_status_json_key_is_documented(world):
    """Scripts read `boxkeyd status --json`: each key it gives is in docs/operations.md."""
    world.start_box()
    world.pair_and_store()
    status = json.loads(world.admin("status", "--json").stdout)
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "operations.md")).read()
    documented = set(re.findall(r"^\s*\| `([a-zA-Z.]+)` \|", doc, re.M))
    missing = sorted(set(json_keys(status)) - documented)
    assert not missing, f"status --json keys not in docs/operations.md: {missing}"
