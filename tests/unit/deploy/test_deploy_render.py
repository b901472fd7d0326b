"""Kustomize rendering (tests/deploy_render.py, issue #37 item 6): the deploy tests render with the real
kustomize, the pinned 5.6.0 from Debian's package (tests/tools/install_kustomize.py, run by `make setup`),
found before a kustomize or kubectl on PATH (deploy/release.py's `find_kustomize`, which the release tool
renders with too). The installer refuses a package or binary whose hash is not the pinned one and leaves
nothing behind; the fabricated packages and tools here need no network."""

from __future__ import annotations

import hashlib
import io
import lzma
import platform
import stat
import tarfile
from pathlib import Path

import pytest

from deploy import release
from tests import deploy_render as dr
from tests.tools import install_kustomize as ik

PINNED = ik.DEFAULT_DEST
# kinds each rendering holds at least (the overlays add their own: the dev stack's StatefulSets, an HTTPRoute)
KINDS = {
    "ConfigMap",
    "CronJob",
    "Deployment",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "RayCluster",
    "RayJob",
    "Service",
}


def _tool(path: Path, stdout: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\n")
    path.chmod(stat.S_IRWXU)
    return path


def _deb(binary: bytes) -> bytes:
    """A .deb as Debian lays it out (ar: debian-binary, control.tar.xz, data.tar.xz) holding BINARY."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo(ik.MEMBER)
        info.size, info.mode = len(binary), 0o755
        tar.addfile(info, io.BytesIO(binary))
    out = b"!<arch>\n"
    for name, body in [("debian-binary", b"2.0\n"), ("control.tar.xz", lzma.compress(b"")), ("data.tar.xz", None)]:
        body = lzma.compress(data.getvalue()) if body is None else body
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(body):<10}`\n".encode() + body + b"\n" * (len(body) % 2)
    return out


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the pinned package is Debian's amd64 build")
def test_the_tests_render_with_the_pinned_kustomize():
    assert ik.is_installed(PINNED), f"{PINNED} is not the pinned kustomize: {release.INSTALL_HINT}"
    assert dr.renderer() == f"kustomize {ik.VERSION} ({PINNED}, Debian's package pinned by sha256)"
    # installed already: the installer returns at once (this session refuses network access)
    assert ik.main(["--dest", str(PINNED)]) == 0


@pytest.mark.parametrize("target", [dr.DEPLOY / "base", *dr.overlay_dirs()], ids=lambda p: p.name)
def test_every_overlay_renders_into_the_expected_kinds(target):
    resources = dr.render(target)
    assert KINDS <= {r["kind"] for r in resources}
    assert all(r["apiVersion"] and r["metadata"]["name"] for r in resources)
    if target.name != "base":
        assert dr.namespace_of(resources)
        assert any(r["kind"] == "StatefulSet" for r in resources) == (target.name == "dev")


def test_render_returns_fresh_copies_and_carries_kustomize_errors(tmp_path):
    overlay = dr.overlay_dirs()[0]
    first = dr.render(overlay)
    first[0]["kind"] = "Changed"
    assert dr.render(overlay)[0]["kind"] != "Changed"
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(dr.KustomizeError, match="missing.yaml"):
        dr.render(tmp_path)


def test_kubectl_kustomize_renders_the_overlays_as_the_pinned_kustomize(monkeypatch):
    """kubectl's embedded kustomize (CALIB_KUSTOMIZE=kubectl) and the pinned one agree, object for object."""
    try:
        release.find_kustomize(only_kubectl=True)
    except release.ReleaseError as exc:
        pytest.skip(str(exc))
    pinned = {o: dr.render(o) for o in dr.overlay_dirs()}
    monkeypatch.setenv(dr.KUSTOMIZE_ENV, "kubectl")
    assert dr.renderer().startswith("kubectl kustomize")
    assert {o: dr.render(o) for o in dr.overlay_dirs()} == pinned


def test_find_kustomize_prefers_the_pinned_then_path_then_kubectl(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    pinned = _tool(python.parent / "kustomize", "(devel)")  # Debian's build prints no version
    on_path = _tool(tmp_path / "path" / "kustomize", "v5.7.1")
    kubectl = _tool(tmp_path / "path" / "kubectl", '{"kustomizeVersion": "v5.5.0"}')
    path = str(on_path.parent)
    find = release.find_kustomize.__wrapped__
    assert find(str(python), path) == ([str(pinned), "build"], f"kustomize (devel) ({pinned})")
    assert find(str(python), path, only_kubectl=True)[0] == [str(kubectl), "kustomize"]
    pinned.unlink()
    assert find(str(python), path)[0] == [str(on_path), "build"]
    _tool(on_path, "{Version:kustomize/v4.5.4 GitCommit:cf3a452}")  # too old: kubectl's is taken
    assert find(str(python), path)[0] == [str(kubectl), "kustomize"]
    _tool(kubectl, '{"kustomizeVersion": "v4.5.7"}')
    with pytest.raises(release.ReleaseError, match="make setup") as refused:
        find(str(python), path)
    assert "v4.5.4" in str(refused.value) and "v4.5.7" in str(refused.value)


def test_without_a_kustomize_rendering_fails_saying_how_to_install_it(monkeypatch, tmp_path):
    def none(**_):
        raise release.ReleaseError(f"no kustomize >= v5 (none found): {release.INSTALL_HINT}")

    monkeypatch.setattr(release, "find_kustomize", none)
    with pytest.raises(dr.KustomizeError, match=r"make setup.*install_kustomize\.py"):
        dr.render(tmp_path)
    monkeypatch.setenv(dr.KUSTOMIZE_ENV, "python")  # the Python stand-in is gone
    with pytest.raises(dr.KustomizeError, match="only 'kubectl'"):
        dr.renderer()


def test_installer_refuses_a_package_whose_hash_is_not_pinned(tmp_path, capsys):
    bad = tmp_path / "kustomize_5.6.0+ds-1+b2_amd64.deb"
    bad.write_bytes(_deb(b"#!/bin/sh\necho not kustomize\n"))
    dest = tmp_path / "bin" / "kustomize"
    assert ik.main(["--dest", str(dest), "--deb", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"expected {ik.DEB_SHA256} (pinned): refusing" in err
    assert not dest.parent.exists()
    dest.parent.mkdir()
    dest.write_bytes(b"an older kustomize")  # what was there stays as it was
    assert ik.main(["--dest", str(dest), "--deb", str(bad)]) == 1
    assert dest.read_bytes() == b"an older kustomize" and [p.name for p in dest.parent.iterdir()] == ["kustomize"]


def test_installer_extracts_the_binary_only_when_both_hashes_match(tmp_path):
    binary = b"#!/bin/sh\necho v5.6.0\n"
    deb = tmp_path / "k.deb"
    deb.write_bytes(_deb(binary))
    deb_sha, bin_sha = hashlib.sha256(deb.read_bytes()).hexdigest(), hashlib.sha256(binary).hexdigest()
    dest = tmp_path / "bin" / "kustomize"
    with pytest.raises(ik.InstallError, match="not the pinned binary"):
        ik.install(deb, dest, deb_sha256=deb_sha, binary_sha256="0" * 64)
    assert not dest.parent.exists()
    ik.install(deb, dest, deb_sha256=deb_sha, binary_sha256=bin_sha)
    assert dest.read_bytes() == binary and ik.is_installed(dest, bin_sha)
    assert [p.name for p in dest.parent.iterdir()] == ["kustomize"]
    assert release._output([str(dest), "version"]) == "v5.6.0"
    with pytest.raises(ik.InstallError, match="not a .deb"):
        ik.install(dest, tmp_path / "other", deb_sha256=bin_sha, binary_sha256=bin_sha)


def test_installer_pin_is_recorded_in_one_place():
    """URL, version and both hashes in tests/tools/install_kustomize.py; the Makefile runs it in setup."""
    assert ik.DEB_URL.startswith("http://deb.debian.org/debian/pool/main/k/kustomize/kustomize_" + ik.VERSION)
    assert len(ik.DEB_SHA256) == len(ik.BINARY_SHA256) == 64
    makefile = (dr.REPO_ROOT / "Makefile").read_text()
    assert "$(BIN)/python tests/tools/install_kustomize.py" in makefile
