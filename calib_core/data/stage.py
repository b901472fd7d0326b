"""`make stage-data`: put a torchvision dataset into the object store for a cluster (calib_core/data/staging.py).

Run from a machine with internet access: the dataset is downloaded with this project's loader into `--root`
(kept: a second run downloads nothing), checked against the official md5 sums, and uploaded with its manifest,
written last (deploy/README.md, "Stage the datasets"). `check` reads a staged copy's manifest back.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from calib_core.data.fetch import ensure_files
from calib_core.data.staging import CHUNK, MANIFEST, build_manifest, dataset_uri, open_store, read_manifest
from calib_core.data.torchvision_sets import SPECS, missing_files
from calib_core.data.torchvision_sets import verify_checksums as official_md5


def stage(name: str, dest: str, root: Path, *, download: bool = True, verify_checksums: bool = True) -> dict:
    """Put dataset `name` (downloaded into `root` when missing and `download`) into `dest`/<name>/, the
    manifest last; return the manifest."""
    from calib_core.data.torchvision_sets import SPECS

    spec = SPECS[name]
    root = root.expanduser().absolute()

    def not_found(gone: list[Path]) -> str:
        return f"{name}: {root} lacks {', '.join(map(str, gone[:3]))}; run without --no-download to fetch it"

    ensure_files(
        name,
        root,
        lambda: missing_files(spec, root),
        lambda: spec.read(root, True),
        allowed=download,
        not_found=not_found,
    )
    if verify_checksums:
        official_md5(spec, root)
    manifest = build_manifest(name, root, spec.files, official_md5_checked=verify_checksums)
    fs, base = open_store(dataset_uri(dest, name))
    if "://" not in dest:
        fs.create_dir(base, recursive=True)
    for entry in manifest["files"]:
        target = f"{base}/{entry['path']}"
        if "://" not in dest:
            fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        with open(root / entry["path"], "rb") as inp, fs.open_output_stream(target) as out:
            while chunk := inp.read(CHUNK):
                out.write(chunk)
    with fs.open_output_stream(f"{base}/{MANIFEST}") as out:  # last: a manifest means a complete copy
        out.write(json.dumps(manifest, indent=1).encode())
    return manifest


def main(argv: list[str] | None = None) -> int:
    """`stage` a dataset into the object store (from a machine with internet access) or `check` a staged copy."""
    p = argparse.ArgumentParser(prog="python -m calib_core.data.stage", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="download (when missing) and upload a dataset with its manifest")
    s.add_argument("dataset", choices=sorted(SPECS))
    s.add_argument("dest", help="s3://bucket/datasets (the cluster's CALIB_DATASETS_URI), or a folder")
    s.add_argument(
        "--root", type=Path, default=Path("data"), help="local download folder (default ./data, ignored by git)"
    )
    s.add_argument("--no-download", action="store_true", help="use the files already under --root")
    s.add_argument("--no-verify-checksums", action="store_true", help="skip the official md5 check (re-packed copy)")
    c = sub.add_parser("check", help="read a staged copy's manifest")
    c.add_argument("dataset", choices=sorted(SPECS))
    c.add_argument("source", help="the staging location (CALIB_DATASETS_URI)")
    args = p.parse_args(argv)
    try:
        if args.cmd == "stage":
            m = stage(
                args.dataset,
                args.dest,
                args.root,
                download=not args.no_download,
                verify_checksums=not args.no_verify_checksums,
            )
            where = dataset_uri(args.dest, args.dataset)
        else:
            m = read_manifest(args.source, args.dataset, SPECS[args.dataset].files)
            where = dataset_uri(args.source, args.dataset)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    total = sum(f["size"] for f in m["files"])
    print(f"{args.dataset}: {len(m['files'])} files, {total / 1e6:.1f} MB at {where} ({MANIFEST} verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
