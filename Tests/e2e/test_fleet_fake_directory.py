"""Attacks from a directory the box trusts but that lies (a compromised server, or one with a
certificate for the directory's name): malformed content-synchronisation messages (RFC 4533)
that a real slapd never sends. Each test asserts the SAFE behaviour: boxkeyd stays up, says what
was wrong, and never takes a broken message for the end of the refresh."""
import json

import pytest

from conftest import wait_for
from fakeldap import SYNC_ADD, UUID, FakeDirectory, entry, integer, sequence, sync_info, sync_state

PERSON = {"uid": ["alice"], "boxkeyPhone": ["cd" * 32], "uidNumber": ["1000"]}
DN = "uid=alice,ou=people,dc=example,dc=org"
REFRESH_DONE = sync_info  # (message_id, value)


def fleet_status(world):
    return json.loads(world.admin("status", "--json").stdout)["fleet"]


def following(world, replies):
    """A box following a fake directory that answers the change stream with `replies(id)`."""
    fake = FakeDirectory(world.work, replies)
    world.settings["fleet"] = fake.fleet_settings(world.work, refresh_s=60)
    world.start_box()
    return fake


@pytest.mark.parametrize("value", [b"", None], ids=["empty-value", "no-value"])
def test_a_sync_state_control_without_a_value_is_an_error_not_a_crash(world, value):
    """Attack: the entry's Sync State control has an empty value (libldap's ber_scanf then read
    past it: boxkeyd segfaulted) or none at all (ber_init on a NULL value: liblber aborted). The
    box reconnected and crashed again, for as long as the server liked."""
    fake = following(world, lambda mid: [entry(mid, DN, PERSON, value)])
    wait_for(lambda: fake.syncs >= 3, timeout=30, what="the box asking for the stream again after the broken one")
    assert world.box_process.poll() is None, f"boxkeyd died:\n{world.box_output()[-3000:]}"
    error = (fleet_status(world).get("error") or "")
    assert "without a valid sync state" in error, error
    assert "following its changes" not in world.box_output()


@pytest.mark.parametrize("value", [
    sequence(b"\x01\x05\xff\xff\xff\xff\xff", tag=0xA1),  # refreshDelete: refreshDone a BOOLEAN of five bytes
    sequence(b"\x01", tag=0xA1),                          # refreshDelete: a tag and no length
    sequence(integer(7), tag=0xA2),                       # refreshPresent holding an INTEGER
    sequence(tag=0xA1) + b"\x00",                         # a well-formed end, then a byte more
    b"\xA1\x05\x01",                                      # refreshDelete longer than the message
], ids=["long-boolean", "truncated", "integer-inside", "trailing-byte", "overlong"])
def test_a_malformed_end_of_refresh_is_an_error_never_refresh_done(world, value):
    """Attack: the refresh's end (refreshDelete/refreshPresent) is malformed. `refreshDone`
    defaulted to TRUE and no parse was checked, so any garbage there read as "the refresh is
    complete": a box that had read only part of the roster (the server's choice of part) took it
    as the whole, and the phones left out lost their links and logins."""
    def replies(mid):
        return [entry(mid, DN, PERSON, sync_state(SYNC_ADD, UUID)), sync_info(mid, value)]
    fake = following(world, replies)
    wait_for(lambda: fake.syncs >= 2, timeout=30, what="the box asking for the stream again after the broken one")
    assert world.box_process.poll() is None, f"boxkeyd died:\n{world.box_output()[-3000:]}"
    assert "following its changes" not in world.box_output(), "the malformed message was taken as the end of the refresh"
    error = (fleet_status(world).get("error") or "")
    assert "content synchronisation" in error and "malformed" in error, error


def test_a_well_formed_refresh_from_the_fake_is_followed(world):
    """The control: the same fake with well-formed messages is followed (so the tests above fail
    for the malformed part alone)."""
    done = sequence(tag=0xA1)  # refreshDelete {} : refreshDone DEFAULT TRUE
    fake = following(world, lambda mid: [entry(mid, DN, PERSON, sync_state(SYNC_ADD, UUID)), REFRESH_DONE(mid, done)])
    wait_for(lambda: "following its changes" in world.box_output(), timeout=30, what=lambda: f"the box following the fake directory (binds {fake.binds}, syncs {fake.syncs}, searches {fake.searches}, ops {fake.ops}):\n" + world.box_output()[-600:])
    assert fake.syncs == 1
    assert fleet_status(world)["phones"] == 1


def test_a_directory_that_pages_for_ever_is_cut_off(world):
    """Attack: every page of the roster's paged search (RFC 2696) ends with a cookie for the
    next, and holds nothing. The box asked again without end: its read never finished, and the
    directory decided how long the box went without a roster."""
    fake = FakeDirectory(world.work, endless_pages=True)
    world.settings["fleet"] = fake.fleet_settings(world.work, refresh_s=5, follow=False)
    world.start_box()
    wait_for(lambda: "still paging" in ((fleet_status(world).get("error") or "") or ""), timeout=30, what="the box giving up on the endless pages")
    asked = fake.searches
    assert 2000 <= asked <= 2100, asked
    assert world.box_process.poll() is None


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0


@pytest.mark.parametrize("dn_mib, entries", [(3, 8), (6, 2)], ids=["big-dns", "one-message-over-4mib"])
def test_a_directory_cannot_fill_the_boxs_memory_with_big_entries(world, dn_mib, entries):
    """Attack: entries whose DNs are megabytes long (a directory may hold them; the box kept
    every DN whole, and libldap takes messages up to 4 GiB): 30 entries with 10 MiB DNs took
    boxkeyd to 1 GiB. Now a DN over 2 KiB (or a name over 256 bytes) is an error, and no
    message over 4 MiB is read at all."""
    def replies(mid):
        return [entry(mid, f"uid=alice{i},{'x' * (dn_mib << 20)},ou=people,dc=example,dc=org", PERSON, sync_state(SYNC_ADD, bytes([i]) * 16))
                for i in range(entries)]
    fake = following(world, replies)
    wait_for(lambda: fake.syncs >= 2, timeout=60, what="the box asking for the stream again after the big entries")
    assert world.box_process.poll() is None
    rss = rss_mib(world.box_process.pid)
    assert rss < 150, f"boxkeyd holds {rss:.0f} MiB"
    assert "following its changes" not in world.box_output()
    error = (fleet_status(world).get("error") or "")
    print(f"{entries} entries of {dn_mib} MiB DNs: boxkeyd at {rss:.0f} MiB; {error}")
    if dn_mib < 4:
        assert "larger than a user's can be" in error, error


def test_a_page_larger_than_asked_for_is_refused_as_it_arrives(world):
    """Review: the paged read took each page whole (ldap_search_ext_s) before the box counted
    it, so a directory that ignores the page size (1,000) could fill one page without limit.
    Entries are now handed over as they arrive, and the 1,001st of a page ends the read."""
    fake = FakeDirectory(world.work, entries_per_page=1500)
    world.settings["fleet"] = fake.fleet_settings(world.work, refresh_s=5, follow=False)
    world.start_box()
    wait_for(lambda: "more than 1000 entries in one page" in (fleet_status(world).get("error") or ""), timeout=30,
             what=lambda: f"the box refusing the oversized page: {fleet_status(world)}")
    assert world.box_process.poll() is None
