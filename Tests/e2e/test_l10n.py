"""Translations: every catalog compiles, keeps every placeholder, and boxkey speaks it."""
import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CATALOGS = sorted(glob.glob(os.path.join(ROOT, "po", "*", "*.po")))


def entries(po):
    """(msgid, [msgstr...]) of a catalog, through msgcat so continuation lines are joined."""
    text = subprocess.run(["msgcat", "--no-wrap", po], capture_output=True, text=True, check=True).stdout
    for block in text.split("\n\n"):
        ids = re.findall(r'^msgid(?:_plural)? "(.*)"$', block, re.M)
        strs = re.findall(r'^msgstr(?:\[\d\])? "(.*)"$', block, re.M)
        if ids and ids[0]:
            yield ids, strs


@pytest.mark.parametrize("po", CATALOGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_catalog_is_complete_and_keeps_every_placeholder(po):
    subprocess.run(["msgfmt", "--check", "-o", os.devnull, po], check=True)
    domain = os.path.basename(os.path.dirname(po))
    template = os.path.join(os.path.dirname(po), domain + ".pot")
    wanted = {ids[0] for ids, _ in entries(template)}
    have = {}
    for ids, strs in entries(po):
        have[ids[0]] = strs
        assert all(strs), f"untranslated: {ids[0]!r}"
        placeholders = set(re.findall(r"\{[a-z]+\}", ids[0]))
        for s in strs:
            assert set(re.findall(r"\{[a-z]+\}", s)) == placeholders, f"{ids[0]!r} -> {s!r}"
    assert wanted <= set(have), f"missing from {po}: {sorted(wanted - set(have))} (scripts/update-po merges new messages)"


def compile_catalogs(tmp_path):
    for po in CATALOGS:
        lang = os.path.basename(po)[:-3]
        target = tmp_path / lang / "LC_MESSAGES"
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["msgfmt", "-o", str(target / (os.path.basename(os.path.dirname(po)) + ".mo")), po], check=True)
    return {"BOXKEY_LOCALEDIR": str(tmp_path), "LANGUAGE": "ru", "LC_ALL": "C.UTF-8"}


def test_boxkey_speaks_russian_when_asked(world, tmp_path):
    ru = compile_catalogs(tmp_path)
    r = world.phone("credentials", "set", "--user", "alice", stdin="x\n", extra_env=ru)
    assert r.returncode == 0 and "Учётные данные alice сохранены." in r.stdout, r.stdout + r.stderr
    r = world.phone("login", "--no-stay", "4821", extra_env=ru)
    assert r.returncode == 4 and "компьютер 4821 не сопряжён: выполните boxkey pair 4821" in r.stderr, r.stderr
    # Without a language asked for, English.
    r = world.phone("login", "--no-stay", "4821", extra_env={"BOXKEY_LOCALEDIR": str(tmp_path), "LC_ALL": "C.UTF-8"})
    assert "box 4821 is not paired" in r.stderr


CYRILLIC = re.compile(r"[а-яА-ЯёЁ]")


def test_the_phones_screens_are_all_russian(world, tmp_path):
    """status, credentials, agent status, scan, the PIN and pairing questions: every line a
    person reads is in the catalog (the values in them stay as they are). --help stays English."""
    ru = compile_catalogs(tmp_path)
    world.start_box()
    world.pair_and_store()
    assert world.phone("pin", "set", stdin="246810\n246810\n").returncode == 0

    def russian(r, stream="stdout"):
        lines = [line for line in getattr(r, stream).splitlines() if line.strip()]
        assert lines and all(CYRILLIC.search(line) for line in lines), getattr(r, stream)

    russian(world.phone("status", extra_env=ru))
    russian(world.phone("credentials", extra_env=ru))
    r = world.phone("agent", "status", extra_env=ru)
    assert r.returncode == 18
    russian(r, "stderr")
    r = world.phone("login", "--no-stay", stdin="abc\n", extra_env=ru)
    assert r.returncode == 16
    russian(r, "stderr")
    r = world.phone("pin", "change", stdin="246810\n135790\n135791\n", extra_env=ru)
    assert r.returncode == 16
    russian(r, "stderr")
    r = world.phone("pair", "4821", "--replace", "--code", "12", extra_env=ru)
    assert r.returncode == 64 and "Usage" not in r.stderr
    russian(r, "stderr")
    r = world.phone("scan", "--seconds", "1", "--sim-position", "45", extra_env=ru)
    russian(r)
