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

from conftest import login, record_figures

PHONES = int(os.environ.get("BOXKEY_LAB_PHONES", "4"))
ROUNDS = int(os.environ.get("BOXKEY_LAB_ROUNDS", "2"))


def percentiles(seconds):
    """p50 and p99 (nearest rank) in ms, and every sample."""
    ms = sorted(round(s * 1000) for s in seconds)
    rank = lambda p: ms[max(0, math.ceil(p / 100 * len(ms)) - 1)]
    return {"p50": rank(50), "p99": rank(99), "all": ms}


@pytest.mark.spoils_lab  # several phones at once have made the lab's kernel oops
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
        "failed": f"{len(failures)} of {PHONES * ROUNDS}"}})
    assert not failures, "\n".join(failures) + "\n--- box:\n" + world.box_output()[-4000:]
