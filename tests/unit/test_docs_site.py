"""The docs site (issue #45 item 4): `mkdocs build --strict` of mkdocs.yml passes, so every page in the nav builds,
every relative link and anchor resolves and every snippet (deploy/README.md) is found; and the same settings fail
on a broken link, so the strict build is what catches one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.paths import ROOT


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    # no -q: quiet mode stops --strict from counting the warnings, and a broken link would pass
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_the_docs_site_builds_in_strict_mode(tmp_path):
    proc = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for page in ("guide", "own-data", "selection", "evidence", "cluster", "deployment", "extending", "performance"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page
    # deploy/README.md is the deployment page's text, included when the site is built
    assert "Running the sweep service on Kubernetes" in (tmp_path / "site" / "deployment" / "index.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path):
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the guide](guide.md#the-sweep).\n")
    (docs / "guide.md").write_text("# Guide\n\n## The sweep\n\nBack [home](index.md).\n")
    cfg.update(docs_dir=str(docs), nav=[{"Home": "index.md"}, {"Guide": "guide.md"}])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(cfg))
    assert _build(tmp_path / "mkdocs.yml", tmp_path / "ok").returncode == 0
    (docs / "guide.md").write_text("# Guide\n\n## The sweep\n\nBack [home](nowhere.md).\n")
    proc = _build(tmp_path / "mkdocs.yml", tmp_path / "broken")
    assert proc.returncode != 0 and "nowhere.md" in proc.stdout + proc.stderr
    (docs / "guide.md").write_text("# Guide\n\n## Another heading\n\nBack [home](index.md).\n")
    proc = _build(tmp_path / "mkdocs.yml", tmp_path / "anchor")
    assert proc.returncode != 0 and "the-sweep" in proc.stdout + proc.stderr


def test_the_readme_links_resolve():
    """README.md is read on the forge, outside the site: its relative links must name files that exist, and every
    docs page it points to is in the site's nav."""
    import re

    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [ln for ln in links if "://" not in ln]
    assert local, "the README links into the docs"
    assert [ln for ln in local if not (ROOT / ln).exists()] == []
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [ln for ln in local if ln.startswith("docs/") and ln.removeprefix("docs/") not in nav] == []
