"""The box as admins run it: files another account could have written are never believed
(the daemon stops with exit 78, naming the file and what to run, and doctor says the same)."""
import copy
import json
import re
import os
import subprocess

import pytest

import time

from conftest import PASSWORD, RADIO, SLOW, wait_for

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


def test_a_long_phone_list_arrives_whole(world):
    """Before: admin output was one frame (at most 2 KB), so `boxkeyd phones list` failed on a
    box with about ten phones. Now a long answer goes in parts."""
    world.start_box()
    keys = [os.urandom(32).hex() for _ in range(40)]
    for n, key in enumerate(keys):
        r = world.admin("phones", "enrol", key, "--user", "alice", "--name", f"phone {n} ✓ жанны")
        assert r.returncode == 0, r.stdout + r.stderr
    r = world.admin("phones", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) > 8000 and sorted(p["key"] for p in json.loads(r.stdout)) == sorted(keys)
    r = world.admin("phones", "list")
    assert r.returncode == 0 and r.stdout.count("phone ") >= 40, r.stdout + r.stderr
    assert world.admin("status").returncode == 0


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


def admin_socket_of(world):
    """The admin socket beside the World's PAM socket (admin.sock for pam.sock)."""
    return os.path.join(os.path.dirname(world.socket), os.path.basename(world.socket).replace("pam", "admin", 1))


def ask_raw(path, kind, body=b""):
    """One request frame (PAM wire 3) on `path`; the reply's kind byte and its text."""
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    frame = bytes([3, kind]) + body
    s.sendall(len(frame).to_bytes(2, "big") + frame)
    head = s.recv(2)
    reply = b""
    while len(reply) < int.from_bytes(head, "big"):
        reply += s.recv(4096)
    s.close()
    return reply[1], reply[3:].decode(errors="replace")


def test_admin_requests_go_to_the_admin_socket_only(world):
    """The PAM socket (the module's) takes no admin request, and the admin socket no prompt."""
    world.start_box()
    admin_socket = admin_socket_of(world)
    # Root's alone: no access for group or others. (It is bound under the daemon's umask 077,
    # then made 0600; a look in between sees 0700, which keeps others out as well.)
    assert os.stat(admin_socket).st_mode & 0o077 == 0
    kind, text = ask_raw(world.socket, 0x12)  # daemonStatus on the PAM socket
    assert kind == 0x85 and "not taken on the PAM socket" in text, text
    kind, text = ask_raw(admin_socket, 0x12)
    assert kind == 0x86 and '"boxID"' in text, text
    wait = b"".join(bytes([len(v)]) + v for v in (b"login", b"tty1", b"", b"", b"")) + (1000).to_bytes(4, "big")
    kind, text = ask_raw(admin_socket, 0x02, wait)  # waitForPush on the admin socket
    assert kind == 0x85 and "not taken on the admin socket" in text, text


def test_reload_answers_and_fails_when_the_file_does_not_load(world):
    """Before: `systemctl reload` sent SIGHUP and returned 0 whatever happened. `boxkeyd reload`
    (the unit's ExecReload) waits for the daemon's answer; status keeps the last outcome."""
    world.start_box()
    r = world.admin("reload")
    assert r.returncode == 0 and "reloaded the configuration" in r.stdout, r.stdout + r.stderr
    path = os.path.join(world.work, "boxkeyd.conf")
    good = open(path).read()
    with open(path, "a") as f:
        f.write("[limits]\nno_such_key = 1\n")

    def boxkeyd(*args):
        return subprocess.run([world.bins["boxkeyd"], *args, "--config", path, "--socket", world.socket],
                              env=world.box_env, capture_output=True, text=True, timeout=20)
    r = boxkeyd("reload")
    assert r.returncode == 1 and "reload failed" in r.stderr and "no_such_key" in r.stderr, r.stdout + r.stderr
    with open(path, "w") as f:
        f.write(good)
    status = json.loads(boxkeyd("status", "--json").stdout)
    assert status["lastReload"].startswith("failed") and "no_such_key" in status["lastReload"], status
    assert boxkeyd("reload").returncode == 0


@pytest.mark.skipif(RADIO == "bluez", reason="the lab's bus has bluetoothd")
def test_without_bluetoothd_the_box_is_ready_at_once_and_its_admin_works(world):
    """Before: on a box without an adapter, status, phones list/revoke and pair-code exited 69
    while systemd said "running" (the sockets came only with the radio), and every start waited
    on D-Bus. Now the sockets come first; the radio joins when bluetoothd and the adapter do."""
    world.settings["radio"] = {"backend": "bluez"}
    admin_socket = admin_socket_of(world)
    started = time.monotonic()
    world.start_box(expect_ready=False)
    wait_for(lambda: os.path.exists(world.socket) and os.path.exists(admin_socket), timeout=5, what="both sockets")
    print(f"FIGURE no bluetoothd: boxkeyd start -> sockets listening {time.monotonic() - started:.3f} s")
    status = json.loads(world.admin("status", "--json").stdout)
    assert "waiting for Bluetooth" in status["radio"] and "bluetoothd is not running" in status["radio"], status
    assert re.search(r"\d{6}", world.admin("pair-code", "--user", "alice").stdout)
    key = "ab" * 32
    assert world.admin("phones", "enrol", key, "--user", "bob").returncode == 0
    phones = json.loads(world.admin("phones", "list", "--json").stdout)
    assert world.admin("phones", "revoke", "--yes", phones[0]["fingerprint"][:9]).returncode == 0
    # A prompt meanwhile: no phone login offered, no code shown, the password works.
    prompt = world.greeter("authenticate", stdin=PASSWORD + "\n", wait=False)
    code, out = world.finish(prompt)
    assert code == 0 and "successfully authenticated" in out and "Pairing code" not in out, out
    assert "not offering phone login" in world.box_output() and "waiting for Bluetooth" in world.box_output()
    assert world.box_process.poll() is None


def test_doctor_tells_a_stopped_daemon_from_a_killed_one_and_warns_of_sudo_in_services(world):
    """Before: doctor said "journalctl says why it stopped" whether the daemon had stopped, been
    killed or was never started, and "ok" with sudo or sshd in [pam] services."""
    world.settings["pam"]["services"] = ["boxkey-test", "sudo", "sshd"]
    world.start_box()
    out = world.admin("doctor").stdout
    assert "warning [pam] services: sudo is listed" in out and "warning [pam] services: sshd is listed: an SSH login is remote" in out, out
    world.box_process.kill()
    world.box_process.wait(10)
    out = world.admin("doctor").stdout
    assert "is there but nobody answers" in out and "systemctl restart boxkeyd" in out, out
    for path in (world.socket, admin_socket_of(world)):
        if os.path.exists(path):
            os.unlink(path)
    out = world.admin("doctor").stdout
    assert "FAILED  boxkeyd: not running (no " in out and "systemctl enable --now boxkeyd" in out, out


def test_doctor_as_another_user_says_what_it_could_not_check(world):
    """Before: a user who only lacked permission got the advice for a stopped daemon."""
    world.start_box()
    path = os.path.join(world.work, "readable.conf")
    with open(world.config()) as f, open(path, "w") as out:
        out.write(f.read())
    os.chmod(path, 0o644)
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}  # not the test's pam_wrapper, which wants root's files
    r = subprocess.run([world.bins["boxkeyd"], "doctor", "--config", path], env=env, capture_output=True,
                       text=True, timeout=30, preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
    out = r.stdout
    assert "warning permissions: not root: the daemon's socket and state cannot be checked" in out, out + r.stderr
    assert "sudo boxkeyd doctor" in out
    assert "boxkeyd: not running" not in out and "nobody answers" not in out, out


def test_admin_commands_reach_the_running_daemon_while_the_file_has_an_error(world):
    """Before: a typo in boxkeyd.conf stopped every admin command (exit 78), even `status
    --socket …`, so a lost phone could not be revoked until it was fixed; and `reload` with a
    non-default socket said "not answering on /run/boxkey/admin.sock" instead of the error."""
    world.start_box()
    world.pair_and_store()
    fingerprint = json.loads(world.admin("phones", "list", "--json").stdout)[0]["fingerprint"]
    world.config_extra = "[radio]\nadvertising_interval_ms = \"fast\"\n"  # a second [radio]: not TOML
    r = world.admin("status")
    assert r.returncode == 0 and "box ID:" in r.stdout and "warning:" in r.stderr and "line" in r.stderr, r.stdout + r.stderr
    r = world.admin("phones", "revoke", "--yes", fingerprint)
    assert r.returncode == 0 and "revoked" in r.stdout, r.stdout + r.stderr
    r = world.admin("reload")
    assert r.returncode == 1 and "reload failed, the running settings stay" in r.stderr and "line" in r.stderr, r.stdout + r.stderr
    assert "not answering" not in r.stderr


def test_a_key_an_older_release_had_is_a_warning_and_the_daemon_runs(world):
    """Before: 0.5's `rejected_pushes_total`, kept in an edited conffile across an upgrade,
    left the daemon failed (apt said only "Could not execute systemctl")."""
    world.config_extra = "[limits]\nrejected_pushes_total = 20\n"
    world.start_box()
    assert "[limits] rejected_pushes_total is no longer used" in world.box_run_output()
    r = subprocess.run([world.bins["boxkeyd"], "--check-config", "--config", world.config()], env=world.box_env, capture_output=True, text=True)
    assert r.returncode == 0 and "OK" in r.stdout and "no longer used" in r.stderr, r.stdout + r.stderr
    assert "no longer used" in world.admin("doctor").stdout


def test_a_drop_in_changes_a_setting_without_touching_the_file(world):
    """`boxkeyd.conf.d/*.conf`, as Ansible, Puppet and Salt write them: a later file's key wins,
    and a section may appear again. Before: appending `[presence]` to the file failed
    ("section [presence] appears twice") and there was no boxkeyd.conf.d."""
    world.start_box()
    folder = world.config() + ".d"
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o755)
    with open(os.path.join(folder, "50-site.conf"), "w") as f:
        f.write("[presence]\ngrace_s = 7\n")
    r = world.admin("reload")
    assert r.returncode == 0 and "grace" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([world.bins["boxkeyd"], "--check-config", "--config", world.config()], env=world.box_env, capture_output=True, text=True)
    assert r.returncode == 0 and "50-site.conf" in r.stdout, r.stdout + r.stderr
    with open(os.path.join(folder, "60-typo.conf"), "w") as f:
        f.write("[presence]\ngrace = 7\n")
    r = world.admin("reload")
    assert r.returncode == 1 and "60-typo.conf line 2: unknown key grace in [presence]" in r.stderr, r.stdout + r.stderr


def test_two_boxes_cloned_from_one_image_get_keys_and_ids_of_their_own(world):
    """Before: the identity was made when the package was installed on the template, so every
    clone shared its key, box ID and enrolled phones. A clone comes up with a new machine ID
    (virt-sysprep, cloud-init, systemd-firstboot): the box then makes an identity of its own
    and moves the image's aside."""
    machine_id = os.path.join(world.work, "machine-id")
    open(machine_id, "w").write("0123456789abcdef0123456789abcdef\n")
    world.box_env["BOXKEY_MACHINE_ID_FILE"] = machine_id
    world.start_box()
    world.pair_and_store()
    image = json.loads(world.admin("status", "--json").stdout)
    world.stop_box()
    open(machine_id, "w").write("fedcba9876543210fedcba9876543210\n")  # the clone's first boot
    world.settings["box"].pop("id")  # an image does not set [box] id per host
    world.start_box()
    clone = json.loads(world.admin("status", "--json").stdout)
    assert clone["publicKey"] != image["publicKey"] and clone["enrolledPhones"] == 0, (image, clone)
    assert "this box was cloned from an image" in world.box_run_output()
    aside = os.path.join(world.work, "box", "from-0123456789abcdef0123456789abcdef")
    assert sorted(os.listdir(aside)) == ["identity", "phones.json"], os.listdir(aside)
    # A restart of the clone keeps its own identity.
    world.stop_box()
    world.start_box()
    assert json.loads(world.admin("status", "--json").stdout)["publicKey"] == clone["publicKey"]


def test_doctor_listens_for_the_boxes_nearby(world):
    """doctor listens on the box's radio for 3 s beside the daemon, and hears the other boxes.
    (A box with this box's ID and another key is a warning: `DoctorTests`. On the simulated air
    one ID has one address, so two such boxes cannot be on it at once.)"""
    world.start_box()
    first = copy.deepcopy(world.settings), world.socket, world.box_log
    world.settings["box"] = {"id": "4822", "state_directory": f"{world.work}/box-4822"}
    world.socket = os.path.join(world.work, "run", "pam-4822.sock")
    world.settings["pam"]["socket"] = world.socket
    world.box_log = os.path.join(world.work, "boxkeyd-4822.log")
    world.start_box()
    world.settings, world.socket, world.box_log = first
    r = world.admin("doctor")
    assert "4821: no other box nearby advertises it (heard 1 other box(es) in 3 s)" in r.stdout, r.stdout
