"""Several phones logging in to one box at the same time over real BlueZ in the VM lab: the lab
reconfigured to one controller per phone plus the box's (btvirt -L -lN), each phone a boxkey
home of its own on its own adapter, each for its own user at its own login prompt (a push goes
only to a prompt for its user). Login times against a single phone go into the lab figures.
BOXKEY_LAB_PHONES (4) and BOXKEY_LAB_ROUNDS (2) size it; the lab is slow, CI keeps it small."""
import math
import os
import threading
import time

import pytest

from conftest import login, record_figures, wait_for

PHONES = int(os.environ.get("BOXKEY_LAB_PHONES", "4"))
ROUNDS = int(os.environ.get("BOXKEY_LAB_ROUNDS", "2"))


def percentiles(seconds):
    """p50 and p99 (nearest rank) in ms, and every sample."""
    ms = sorted(round(s * 1000) for s in seconds)
    rank = lambda p: ms[max(0, math.ceil(p / 100 * len(ms)) - 1)]
    return {"p50": rank(50), "p99": rank(99), "all": ms}


# Several links torn down at once make the lab's 6.1 kernel oops (list_del corruption in
# hci_chan_del from l2cap_sock_release: a locking race in L2CAP that upstream fixed in 2025 with
# "Bluetooth: L2CAP: Fix corrupted list in hci_chan_del"); the VM is useless after it.
@pytest.mark.spoils_lab
@pytest.mark.parametrize("controllers", [PHONES + 1], indirect=True)
def test_concurrent_logins(world, controllers):
    users = [f"phone{k}" for k in range(1, PHONES + 1)]
    for k, user in enumerate(users, 1):
        world.add_user(user, 2000 + k, f"{user}'s password")
        world.phone_adapters[user] = controllers[k]  # hci0 is the box's
    # Every prompt waits while the others are set up and all the phones run at once.
    world.module_options = "timeout=120 answer_prompt"
    world.start_box()
    for user in users:
        world.pair_and_store(password=f"{user}'s password", user=user, who=user)

    single = [login(world, who=users[0], user=users[0])[0] for _ in range(ROUNDS)]

    concurrent, failures = [], []
    for _ in range(ROUNDS):
        greeters = [world.greeter(user=user, tty=f"tty{k}") for k, user in enumerate(users, 1)]
        results = {}

        def run(user):
            start = time.monotonic()
            r = world.phone("login", "--no-stay", timeout=300, who=user)
            results[user] = (r, time.monotonic() - start)

        threads = [threading.Thread(target=run, args=(user,)) for user in users]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for user, greeter in zip(users, greeters):
            r, elapsed = results[user]
            if r.returncode == 0 and f"Logged in to box 4821 as {user}" in r.stdout:
                concurrent.append(elapsed)
                rc, out = world.finish(greeter, timeout=60)
                assert rc == 0, out
            else:
                failures.append(f"{user}: exit {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}")
                greeter.kill()

    record_figures({"concurrent_logins": {
        "phones": PHONES, "rounds": ROUNDS, "single_phone_ms": percentiles(single),
        "concurrent_ms": percentiles(concurrent) if concurrent else None,
        "failed": f"{len(failures)} of {PHONES * ROUNDS}",
        "message_1_sent_again": world.box_output().count("sent message 1 again")}})
    assert not failures, "\n".join(failures) + "\n--- box:\n" + world.box_output()[-4000:]


@pytest.mark.spoils_lab  # the same oops, at the end, as the presence link is torn down
@pytest.mark.parametrize("controllers", [3], indirect=True)
def test_a_second_phone_logs_in_while_another_holds_its_presence_link(world, controllers):
    """A controller stops advertising when a central connects, and the kernel starts it again
    only at the next disconnection: unless the box advertises again, no other phone can reach
    it while one holds its presence link."""
    for k, user in enumerate(["phone1", "phone2"], 1):
        world.add_user(user, 2000 + k, f"{user}'s password")
        world.phone_adapters[user] = controllers[k]
    world.start_box()
    for user in ["phone1", "phone2"]:
        world.pair_and_store(password=f"{user}'s password", user=user, who=user)
    greeter = world.greeter(user="phone1", tty="tty1")
    holder = world.phone_background("login", who="phone1")
    wait_for(lambda: "Staying connected" in open(holder.log).read(), what="phone1's presence link")
    assert world.finish(greeter)[0] == 0

    elapsed, _ = login(world, who="phone2", user="phone2", tty="tty2")
    assert "Staying connected" in open(holder.log).read() and "presence link lost" not in world.box_output()
    # phone2's message 1 may overtake its subscription while phone1 is subscribed: the box,
    # told only of a characteristic's first subscriber, answers at once, and the answer is lost
    # unless phone2 asks again. How often that happened is a figure.
    record_figures({"login_beside_a_presence_link_ms": round(elapsed * 1000),
                    "message_1_sent_again_beside_a_presence_link": world.box_output().count("sent message 1 again")})
