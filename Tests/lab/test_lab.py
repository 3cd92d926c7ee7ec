"""Boxkey over real BlueZ in the VM lab (../shared/blelab): boxkeyd on hci0, boxkey on hci1,
the real kernel stack and bluetoothd between them, the real PAM stack at the box. Run through
scripts/lab-test, which builds on the host and boots the lab once for all of these."""
import json
import os
import re
import subprocess

from conftest import login, record_figures, wait_for

BOX = "00:AA:01:00:00:00"
PHONE = "00:AA:01:01:00:01"
HERE = os.path.dirname(__file__)
BLEAK_PYTHON = os.path.join(os.environ.get("BLELAB_CACHE", "/var/cache/blelab"), "venv", "bin", "python3")


def bluetoothctl_sees_box():
    script = (f"echo 'select {PHONE}'; echo 'remove {BOX}'; sleep 0.5; echo 'scan le'; sleep 6; echo 'scan off'; "
              "sleep 0.5; echo quit")
    out = subprocess.run(["bash", "-c", f"{{ {script}; }} | bluetoothctl"], capture_output=True, text=True, timeout=60).stdout
    out = re.sub(r"\x1b\[[0-9;]*[a-zA-Z]", "", out)
    return f"Device {BOX}" in out, out


# The protocol version the sources speak (Sources/BoxkeyCore/Protocol/BoxkeyProtocol.swift).
with open(os.path.join(HERE, "..", "..", "Sources", "BoxkeyCore", "Protocol", "BoxkeyProtocol.swift")) as _f:
    PROTOCOL = int(re.search(r"static let version: UInt8 = (\d+)", _f.read()).group(1))


def test_boxkey_over_bluez(world):
    world.start_box()
    assert "BlueZ adapter hci0" in world.box_output()

    seen, out = bluetoothctl_sees_box()
    assert seen, out

    world.pair_and_store()
    first_s, first_out = login(world)

    # An independent central: scan, connect, read the service, one garbage write, one answer.
    r = subprocess.run([BLEAK_PYTHON, os.path.join(HERE, "bleak_probe.py"), "hci1"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    probe = json.loads(r.stdout.strip().splitlines()[-1])
    assert probe["address"] == BOX and probe["service_found"] and probe["info_bytes"] > 0
    # The box refused the envelope on the probe's channel (a refusal envelope: the box's own
    # protocol version, kind 4).
    assert probe["answers"] and probe["answers"][0].startswith("b00b1e55" + "00" + "0005" + f"{PROTOCOL:02x}04"), probe
    wait_for(lambda: "another protocol version" in world.box_output(), what="the box logging the refusal")

    # The daemon kept serving: the same phone logs in again, and the timing pair is taken now.
    second_s, second_out = login(world)
    assert world.box_process.poll() is None

    # The box hangs up on a phone that is done (Detach), seen by the phone as a clean end.
    # boxkey's own figure runs from opening the radio to the box's answer (the vault's Argon2id
    # unlock and the process start come before it); the wall time includes them.
    radio_ms = [int(m.replace(",", "")) for m in re.findall(r"\(([\d,]+) ms\)", first_out + "\n" + second_out)]
    figures = {"boxkey_login_wall_ms": [round(first_s * 1000), round(second_s * 1000)],
               "boxkey_login_radio_ms": radio_ms, "bleak": probe,
               "message_1_sent_again": world.box_output().count("sent message 1 again")}
    record_figures(figures)

    # No password in anything any process printed.
    from conftest import PASSWORD
    assert all(PASSWORD not in o for o in world.outputs)
    assert PASSWORD not in world.box_output()
