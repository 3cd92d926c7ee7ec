"""A box that starts before its Bluetooth does, over real BlueZ in the VM lab: bluetoothd started
after boxkeyd (a boot where bluetooth.service comes late, or an admin's `systemctl start
bluetooth`), and a controller plugged in after both (a thin client's dongle), then pulled out and
plugged in again. Meanwhile the box answers its admin socket and says what it waits for; it
advertises once the adapter is there (within 2 s of bluetoothd publishing it), without being
restarted, and a phone logs in."""
import json
import signal
import time

import pytest

from conftest import adapters, add_controllers, bluetoothd_answers, btmgmt, launch_bluetoothd, login, pids, published_adapters, \
    record_figures, remove_controllers, set_controllers, stop_all, wait_for


def advertising_since(world, before):
    return world.box_output().count("advertising box") > before


def bluetooth_arrives(world, what):
    """Runs `what` (Bluetooth coming: bluetoothd launched, or a controller added), then times
    from its start: bluetoothd publishing an adapter, and the box advertising on it. Returns
    (published_s, advertising_s)."""
    before = world.box_output().count("advertising box")
    start = time.monotonic()
    what()
    published = advertising = None
    while published is None or advertising is None:
        now = round(time.monotonic() - start, 2)
        assert now < 30, f"after 30 s: published {published}, advertising {advertising}"
        if advertising is None and advertising_since(world, before):
            advertising = now
        if published is None and published_adapters() >= 1:
            published = now
        time.sleep(0.05)
    return published, advertising


def waits_for_bluetooth(world, why):
    wait_for(lambda: "waiting for Bluetooth: " + why in world.box_output(), timeout=60, what=f"the box waiting ({why})")
    status = json.loads(world.admin("status", "--json").stdout)  # administration never waits for the radio
    assert "waiting for Bluetooth" in status["radio"], status


@pytest.mark.parametrize("missing", ["bluetoothd", "adapter"])
def test_a_box_started_before_its_bluetooth_advertises_when_it_comes(world, missing):
    figures = {}
    try:
        stop_all("bluetoothd", signal.SIGKILL)  # no link is up: SIGKILL only to leave the adapters as they are
        if missing == "adapter":
            remove_controllers()
            launch_bluetoothd()
            wait_for(bluetoothd_answers, timeout=30, interval=0.5, what="bluetoothd answering")
        world.start_box(expect_ready=False)
        waits_for_bluetooth(world, "bluetoothd is not running" if missing == "bluetoothd" else "no Bluetooth adapter")
        assert world.box_process.poll() is None

        # The box powers its own adapter on; the phone's (hci1) is powered as start_bluetoothd does.
        comes = launch_bluetoothd if missing == "bluetoothd" else (lambda: add_controllers(2))
        figures["published_s"], figures["advertising_s"] = bluetooth_arrives(world, comes)
        wait_for(lambda: published_adapters() >= 2, timeout=30, interval=0.2, what="bluetoothd to publish both adapters")
        for adapter in adapters():
            btmgmt(adapter, "power", "on")
        world.pair_and_store()
        login(world)

        if missing == "adapter":
            # Pulled out and plugged in again, the box idle and not restarted: a phone logs in.
            remove_controllers()
            time.sleep(1)
            assert json.loads(world.admin("status", "--json").stdout)["boxID"] == "4821"
            add_controllers(2)
            wait_for(lambda: published_adapters() >= 2, timeout=30, interval=0.2, what="bluetoothd to publish the adapters again")
            for adapter in adapters():
                btmgmt(adapter, "power", "on")
            login(world)
        assert world.box_process.poll() is None
    finally:
        if len(adapters()) != 2 or not pids("bluetoothd") or not bluetoothd_answers():
            world.stop_box()
            set_controllers(2)
    record_figures({f"box_started_before_{missing}": figures})
    # Within 2 s of the adapter being there (published on the bus; polled, so an upper bound).
    assert figures["advertising_s"] - figures["published_s"] <= 2.0, figures
