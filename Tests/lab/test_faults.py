"""Faults of the Bluetooth stack under a running box, over real BlueZ in the VM lab: bluetoothd
killed and started again (a crash that systemd restarts), and the box's adapter powered off and
on, each while the box is idle and while a phone holds the presence link. Whatever happens the
box must come back advertising (a later login works), and a session must never stay unlocked
without its presence link: the link re-attaches within the grace period, or the session gets
locked.

bluetoothd is killed with SIGKILL, not stopped with SIGTERM: SIGTERM while an LE link is up
makes the lab's 6.1 kernel oops (list_del corruption in hci_chan_del from l2cap_sock_release,
as bluetoothd powers the adapters off on its way out), which poisons the VM for every later test."""
import os
import signal
import time

import pytest

from conftest import LAB_LOGS, bluetoothd_answers, bluetoothd_blocked_in, btmgmt, drop_le_links, login, pids, record_figures, restart_bluetoothd, stop_process, wait_for

GRACE_S = 15  # long enough for the phone to find the box again after the fault (lab time)


def box_adapter_power_cycle():
    btmgmt("hci0", "power", "off")
    # btvirt never times a link out: the phone's side of it would stay up (and its connects fail
    # with EBUSY) where a real controller ends it after the supervision timeout (420 ms).
    drop_le_links("hci1")
    time.sleep(1)
    btmgmt("hci0", "power", "on")


FAULTS = {"bluetoothd_killed": lambda: restart_bluetoothd(sig=signal.SIGKILL),
          "box_adapter_power_cycle": box_adapter_power_cycle}


# The box's controller powered off under a live link can make the lab's kernel oops: last.
CASES = [pytest.param(fault, holding, id=f"{fault}-{'presence' if holding else 'idle'}",
                      marks=[pytest.mark.spoils_lab] if fault == "box_adapter_power_cycle" and holding else [])
         for fault in FAULTS for holding in (False, True)]


# Before the lab's btvirt was patched (Tests/lab/btvirt/links.patch) these passed in one run and
# broke the next: a phone reconnecting while the box's controller still held its old link got a
# link whose two ends had different handles, and stock btvirt delivered its data to the old one.
@pytest.mark.parametrize("fault, holding", CASES)
def test_box_comes_back_and_never_leaves_a_session_unguarded(world, fault, holding):
    world.settings["presence"]["grace_s"] = GRACE_S
    world.start_box()
    world.pair_and_store()
    figures = {}
    if holding:
        greeter = world.greeter("authenticate", "open_session")
        phone = world.phone_background("login")
        wait_for(lambda: "Staying connected" in open(phone.log).read(), what="presence link")
        assert world.finish(greeter)[0] == 0
        back_before = world.box_output().count("presence link back")

    start = time.monotonic()
    FAULTS[fault]()
    figures["fault_s"] = round(time.monotonic() - start, 1)

    if holding:
        locked = lambda: 'LockSession "42"' in world.logind.calls()
        back = lambda: world.box_output().count("presence link back") > back_before
        wait_for(lambda: locked() or back(), timeout=GRACE_S + 15, what="the presence link back or the session locked")
        figures["outcome"] = "locked" if locked() else "re-attached"
        figures["outcome_after_s"] = round(time.monotonic() - start, 1)
        if not locked():
            # Back, so the box must still be watching it: a phone that dies without a word
            # (no keepalives) gets the session locked.
            phone.send_signal(signal.SIGKILL)
            wait_for(locked, timeout=15, what="LockSession after the re-attached phone died")
        # The box logs the lock once logind has answered, a moment after the mock records it.
        wait_for(lambda: "walk-away lock" in world.box_output(), what="the box logging its walk-away lock")
        stop_process(phone, signal.SIGKILL)  # not to race the login below for the link
        # In half the runs a link from hci1 comes up again the moment the box hangs up on the
        # killed phone's link (a new connection in the box's log that second, the same handle
        # on both controllers, no phone process running: bluetoothd's own doing), and every
        # connection made beside it then failed while resolving services, for up to 2 minutes,
        # with old and new builds alike. Box and phone share one bluetoothd and btvirt here; a
        # phone is a device of its own. End that link, as a phone's stack ends an unused one.
        drop_le_links("hci1")

    # bluetoothd itself must still be there (the lab has no systemd to restart it again).
    assert pids("bluetoothd"), "bluetoothd died after its restart:\n" + open(os.path.join(LAB_LOGS, "bluetoothd.log")).read()[-2000:]
    # In CI's lab a bluetoothd just restarted under a presence link has, now and then, not
    # answered D-Bus for over 10 s after the SIGKILLed phone's link went (the box's own calls
    # timed out too). The phone's scan would fail on that, not on the box: wait for bluetoothd
    # first (the box is expected to come back once it answers), and say where it was stuck.
    stalled_at = time.monotonic()
    wait_for(bluetoothd_answers, timeout=60, interval=1,
             what=lambda: f"bluetoothd to answer D-Bus ({bluetoothd_blocked_in()})")
    figures["bluetoothd_stalled_s"] = round(time.monotonic() - stalled_at, 1)
    # The box advertises again: a scan finds it, and a login goes through.
    r = world.phone("scan", "--id", "4821", "--seconds", "60", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr + world.box_output()[-3000:]
    figures["advertising_again_after_s"] = round(time.monotonic() - start, 1)
    login(world)
    assert world.box_process.poll() is None
    record_figures({f"fault_{fault}_{'presence' if holding else 'idle'}": figures})
