"""The shipped documentation: every page a shipped page links is in the same package, and
every version the docs name is the release's (debian/changelog is the one place it is set)."""
import glob
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
