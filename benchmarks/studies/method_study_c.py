"""Method study, protocol C (issue #31): its command, for the cheap slice and the full factorial.

    python -m benchmarks.studies method_study_c slice                      # run what is missing (resumable), then report
    python -m benchmarks.studies method_study_c slice --regimes overconf   # one regime
    python -m benchmarks.studies method_study_c slice --report-only        # rebuild the report from the compact files
    python -m benchmarks.studies method_study_c full --regimes overconf [--workers 2]   # the full factorial (resumable)
    python -m benchmarks.studies method_study_c full --report-only                      # its report

(`python -m benchmarks.studies.method_study_c ...`, the form the results record, is the same command.) The slice, and
the run, storage and verdict functions the full factorial is built on, are `method_study_c_slice.py`; the full
factorial is `method_study_c_full.py`. This module is above both, so neither imports the other's caller (issue #45:
no import cycle in benchmarks/).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import RESULTS_DIR, command_line, write_json, write_text
from benchmarks.studies import method_study_c_full as full
from benchmarks.studies import method_study_c_slice as msc


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["slice", "full"], help="slice: the cheap slice; full: the full factorial")
    p.add_argument("--protocol", default=str(msc.SPEC))
    p.add_argument("--out", default=str(msc.OUT), help="the compact results' folder")
    p.add_argument(
        "--report-dir", default=None, help="where the report goes (default benchmarks/results; --tiny: --out)"
    )
    p.add_argument("--regimes", default=None)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--no-bootstrap", action="store_true", help="skip the per-seed bootstrap half-widths")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="smoke test: 600 samples, 2 epochs, 2 seeds; full: 4 trials, 2 random (numbers mean nothing)",
    )
    p.add_argument("--limit", type=int, default=None, help="run at most this many runs")
    p.add_argument("--allow-mixed-commits", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="the thread-count check: run at this many threads")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: the slice's)")
    p.add_argument("--study", default="slice", help="table name: slice, or threads2 for the thread-count check")
    p.add_argument("--workers", type=int, default=1, help="full: worker processes (lanes)")
    p.add_argument("--retune", default=None, help="full: re-tune these cells (objective/post, comma-separated)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    spec = msc.load_spec(Path(args.protocol))
    out = Path(args.out).resolve()
    if args.tiny and out == msc.OUT.resolve():
        raise SystemExit("--tiny writes smoke numbers: give --out a scratch folder, not the study's results")
    if args.report_dir is None:
        args.report_dir = str(out if args.tiny else RESULTS_DIR)
    if args.stage == "full":
        return full.main_full(args, spec, command_line(__file__, argv))
    regimes = args.regimes.split(",") if args.regimes else list(spec["regimes"])
    if not args.report_only:
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
        msc.run_slice(
            spec, regimes, out, args.tiny, args.allow_mixed_commits, args.limit, seeds, args.threads, args.study
        )
    text, rec = msc.build_slice_report(spec, out, command_line(__file__, argv), not args.no_bootstrap)
    if args.tiny:
        text = "**SMOKE RUN (--tiny): 600 samples, 2 epochs, 2 seeds; the numbers mean nothing.**\n\n" + text
    write_text(Path(args.report_dir) / "method_study_c_slice.md", text)
    write_json(Path(args.report_dir) / "method_study_c_slice.json", rec)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
