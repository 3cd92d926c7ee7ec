"""The shipped documentation: every page a shipped page links is in the same package, and
every version the docs name is the release's (debian/changelog is the one place it is set)."""
import glob
import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS_LISTS = sorted(glob.glob(os.path.join(ROOT, "debian", "*.docs")))
# Every package ships its copyright file; README's LICENSE link is that text.
ALWAYS_SHIPPED = {"LICENSE", "debian/copyright"}


def release():
    return subprocess.run(["dpkg-parsechangelog", "-S", "Version"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.mark.parametrize("docs", DOCS_LISTS, ids=os.path.basename)
def test_every_page_a_shipped_page_links_is_shipped_too(docs):
    shipped = [line.strip() for line in open(docs) if line.strip()]
    missing = []
    for page in shipped:
        assert os.path.exists(os.path.join(ROOT, page)), f"{docs} lists {page}, which does not exist"
        if not page.endswith(".md"):
            continue
        for target in re.findall(r"\]\(([^)#\s]+)", open(os.path.join(ROOT, page)).read()):
            if re.match(r"[a-z]+:", target):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target))
            if path not in shipped and path not in ALWAYS_SHIPPED:
                missing.append(f"{page} -> {path}")
    assert not missing, f"{os.path.basename(docs)} lacks pages its docs link: {missing}"


def test_every_version_the_docs_name_is_the_release():
    version = release()
    code = open(os.path.join(ROOT, "Sources/BoxkeyCore/Protocol/BoxkeyProtocol.swift")).read()
    assert f'public static let version = "{version}"' in code, "BoxkeyRelease differs from debian/changelog"
    wrong = []
    pages = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md")),
             *glob.glob(os.path.join(ROOT, "man", "*.[0-9]"))]
    patterns = [r"_(\d+\.\d+\.\d+)_amd64", r'"Boxkey (\d+\.\d+\.\d+)"', r"boxkeyd? (\d+\.\d+\.\d+) \(protocol",
                r"version:\s+(\d+\.\d+\.\d+)"]
    for page in pages:
        text = open(page).read()
        for pattern in patterns:
            for m in re.finditer(pattern, text):
                if m.group(1) != version:
                    wrong.append(f"{os.path.relpath(page, ROOT)}: {m.group(0)}")
    assert not wrong, f"not release {version}: {wrong}"


def man_keys(after, until):
    """The bold words of boxkeyd(8) between two of its lines: a list of JSON keys."""
    man = open(os.path.join(ROOT, "man", "boxkeyd.8")).read()
    block = man[man.index(after):man.index(until, man.index(after))]
    return set(re.findall(r"^\.BR? ([A-Za-z]+)", block, re.M))


def test_boxkeyd_8_names_the_keys_status_json_has(world):
    """boxkeyd(8) lists the keys of `boxkeyd status --json`: each one the daemon prints is
    there, and each one there is one it prints (`fleet` and `lastReload` only when they apply)."""
    world.start_box()
    printed = set(json.loads(world.admin("status", "--json").stdout))
    documented = man_keys("print one JSON object instead, with the keys", ".TP")
    assert printed - documented == set(), f"boxkeyd(8) does not name {sorted(printed - documented)}"
    assert documented - printed <= {"fleet", "lastReload"}, f"boxkeyd(8) names {sorted(documented - printed)}, which status does not print"


def test_boxkeyd_8_names_the_keys_doctor_json_has(world):
    r = world.admin("doctor", "--json")
    findings = json.loads(r.stdout)["findings"]
    printed = set().union(*(f.keys() for f in findings))
    documented = man_keys("print a JSON object instead: a list", ".TP") - {"findings", "ok", "warning", "failed"}
    assert printed <= documented, f"boxkeyd(8) does not name {sorted(printed - documented)}"


# Files the docs name that exist only on a running box, never in the tree.
RUNTIME_FILES = {"guard.json", "phones.json", "escrow.json", "fleet-roster.json", "box.key", "machine-id", "boxes.json",
                 "phone.key", "vault.json", "fleet.json", "boxkeyd.conf.d", "pam.sock", "admin.sock", "agent.sock"}


def tree_words():
    """Every identifier in the tree's code and tests, and every file's name without extension."""
    r = subprocess.run(["git", "grep", "-h", "-o", "-I", "-E", r"[A-Za-z_][A-Za-z0-9_]*", "--", "Sources", "Tests", "scripts",
                        "pam", "systemd", "Benchmarks", "Fuzz", "debian", "man", "ldap"], cwd=ROOT, capture_output=True, text=True)
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return set(r.stdout.split()) | {os.path.splitext(os.path.basename(f))[0] for f in files}, files


@pytest.mark.parametrize("page", ["docs/architecture.md", "docs/threat-model.md"])
def test_the_code_a_doc_names_is_in_the_tree(page):
    """The pages about Boxkey's own code (the others name other programs' code, GDM's and
    BlueZ's). Every identifier a doc names in backticks (a type, a test, a function: CamelCase or
    snake_case), every path, and every "`Suite` (N tests)" count is what the tree has: a doc
    that drifts from the code fails here, not in a newcomer's afternoon."""
    words, files = tree_words()
    text = open(os.path.join(ROOT, page)).read()
    wrong = []
    for token in set(re.findall(r"`([^`\n]+)`", text)):
        if re.fullmatch(r"[\w.+-]+(/[\w.+-]*)+/?", token) and not token.startswith(("/", "../")) and "://" not in token:
            path = token.rstrip("/")
            if not any(f == path or f.startswith(path + "/") or f.endswith("/" + path) or ("/" + path + "/") in ("/" + f)
                       for f in files):
                wrong.append(f"path {token}")
        elif re.fullmatch(r"[\w-]+\.(swift|c|h|py)", token):
            if not any(os.path.basename(f) == token for f in files):
                wrong.append(f"file {token}")
        else:
            for ident in re.findall(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b", token):
                looks_like_code = re.search(r"[a-z][A-Z]", ident) or (re.search(r"[a-z]_[a-z]", ident) and ident.islower())
                if looks_like_code and ident not in words and ident not in RUNTIME_FILES:
                    wrong.append(f"identifier {ident} (in `{token}`)")
    for suite, count in re.findall(r"`(\w+Tests)` \((\d+) tests\)", text):
        source = next((f for f in files if os.path.basename(f) == suite + ".swift"), None)
        actual = open(os.path.join(ROOT, source)).read().count("@Test") if source else None
        if actual != int(count):
            wrong.append(f"`{suite}` ({count} tests): the tree has {actual}")
    assert not wrong, f"{page} names what the tree lacks:\n  " + "\n  ".join(sorted(wrong))
