#!/usr/bin/env python3
"""Install the kustomize the deploy tests render with: Debian's kustomize 5.6.0 package, pinned by hash.

    python tests/tools/install_kustomize.py [--dest .venv/bin/kustomize] [--deb FILE]

Downloads the .deb from deb.debian.org, refuses it unless its SHA-256 is the pinned one, and
extracts only usr/bin/kustomize (standard library: the .deb is an ar archive holding data.tar.xz)
to DEST (default: beside this Python, i.e. .venv/bin/kustomize when run by `make setup`). The file
appears complete or not at all (written beside DEST, checked against the binary's pinned hash,
then renamed). Idempotent: nothing is downloaded when DEST already holds the pinned binary.
`--deb FILE` installs from a .deb already here (same checks). Exit 0 when installed or already
there (or on a machine this package does not run on, saying so), 1 with one line otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import os
import platform
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

# Debian trixie, main/binary-amd64/Packages (http://deb.debian.org/debian/dists/trixie/main/binary-amd64/Packages.xz):
# Package: kustomize, Version: 5.6.0+ds-1+b2, Depends: libc6 (>= 2.34), Filename and SHA256 as below.
VERSION = "5.6.0"
DEB_URL = "http://deb.debian.org/debian/pool/main/k/kustomize/kustomize_5.6.0+ds-1+b2_amd64.deb"
DEB_SHA256 = "552bbe5563b522685b10f75a9a226bfbee9778fc313b205d595fdbb7e9c70e33"
BINARY_SHA256 = "8c9b67e214e9814f1ef2ee87185af8a0842ad62c04d762ac8a5955972e66e26b"  # its usr/bin/kustomize
MEMBER = "./usr/bin/kustomize"
DEFAULT_DEST = Path(sys.executable).parent / "kustomize"  # not resolved: the venv's bin/, not the base Python's


class InstallError(RuntimeError):
    pass


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_installed(dest: Path, binary_sha256: str = BINARY_SHA256) -> bool:
    return dest.is_file() and os.access(dest, os.X_OK) and sha256(dest) == binary_sha256


def _data_tar(deb: bytes) -> bytes:
    """The data.tar.xz member of a .deb (an ar archive: 8-byte magic, then 60-byte headers)."""
    if not deb.startswith(b"!<arch>\n"):
        raise InstallError("not a .deb (no ar archive magic)")
    pos = 8
    while pos + 60 <= len(deb):
        name, size = deb[pos : pos + 16].decode().strip().rstrip("/"), int(deb[pos + 48 : pos + 58])
        if name == "data.tar.xz":
            return lzma.decompress(deb[pos + 60 : pos + 60 + size])
        pos += 60 + size + size % 2
    raise InstallError("the .deb has no data.tar.xz")


def install(deb_path: Path, dest: Path, deb_sha256: str = DEB_SHA256, binary_sha256: str = BINARY_SHA256) -> None:
    """Extract the pinned binary from DEB_PATH to DEST; DEST is untouched unless every check passes."""
    got = sha256(deb_path)
    if got != deb_sha256:
        raise InstallError(f"{deb_path}: sha256 {got}, expected {deb_sha256} (pinned): refusing to install it")
    with tarfile.open(fileobj=io.BytesIO(_data_tar(deb_path.read_bytes()))) as tar:
        member = tar.extractfile(MEMBER)
        if member is None:
            raise InstallError(f"{deb_path}: no {MEMBER} in the package")
        binary = member.read()
    if hashlib.sha256(binary).hexdigest() != binary_sha256:
        raise InstallError(f"{deb_path}: {MEMBER} is not the pinned binary (sha256 {binary_sha256})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".kustomize-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(binary)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    ap.add_argument("--deb", type=Path, help="a downloaded .deb to install from (default: download DEB_URL)")
    args = ap.parse_args(argv)
    if is_installed(args.dest):
        return 0
    if args.deb is None and platform.machine() not in ("x86_64", "AMD64"):
        print(f"install_kustomize: no pinned kustomize for {platform.machine()}: put kustomize >= v5 on PATH")
        return 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            deb = args.deb
            if deb is None:
                deb = Path(tmp) / DEB_URL.rsplit("/", 1)[1]
                with urllib.request.urlopen(DEB_URL, timeout=120) as r:
                    deb.write_bytes(r.read())
            install(deb, args.dest)
    except (InstallError, OSError, ValueError) as exc:
        print(f"install_kustomize: {exc}", file=sys.stderr)
        return 1
    print(f"install_kustomize: kustomize {VERSION} (Debian {DEB_URL.rsplit('/', 1)[1]}) -> {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
