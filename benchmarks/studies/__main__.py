"""The study runner: every method and selection study behind one command (issue #33 item 4).

    python -m benchmarks.studies                          # list the studies
    python -m benchmarks.studies STUDY [ARGS...]          # run one with its own arguments
    python -m benchmarks.studies STUDY --help             # its options

`python -m benchmarks.studies method_study_c full --regimes overconf` is `python -m benchmarks.studies.method_study_c
full --regimes overconf`: the study runs as the main module (its worker processes too), with the arguments as given.
Run from the repository root; the protocols the studies follow are in benchmarks/studies/protocols/, their results in
benchmarks/results/ (INDEX.md names the command of each, and for a superseded study whose code has left the tree, the
commit that reproduces its result).
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

# name -> (module, what it studies); the name is the module's own, so both command forms read alike
STUDIES: dict[str, tuple[str, str]] = {
    "method_study_c": (
        "benchmarks.studies.method_study_c",
        "protocol C (issue #31): `slice` (TS stacked on protocol A's backbones), `full` (the factorial, resumable)",
    ),
    "method_study_c_power": ("benchmarks.studies.method_study_c_power", "protocol C's power table, from A's spread"),
    "reproducibility": ("benchmarks.studies.reproducibility", "how far one seed's result moves (threads, machines)"),
    "reproduce": (
        "benchmarks.studies.reproduce",
        "the untuned method matrix; `--no-matrix`: the one-go overhead per epoch (overhead.md)",
    ),
    "selection_v3": (
        "benchmarks.studies.selection_v3",
        "the margin rule with reference arms and TS on top, judged on new seeds (the current default's study)",
    ),
    "selection_v4": (
        "benchmarks.studies.selection_v4",
        "the simplest selection rule the evidence supports (issue #45): `--analyse`, `--power`",
    ),
    "conformal_sets_v1": (
        "benchmarks.studies.conformal_sets_v1",
        "one-go or CE_es + TS, which gives smaller conformal sets (issue #48): `--analyse`, `--quick`",
    ),
    "bench_search": ("benchmarks.studies.bench_search", "TPE vs random vs grid on a tabulated objective"),
    "study_compact": (
        "benchmarks.studies.study_compact",
        "a study's raw folder to its compact form (a tool of the above)",
    ),
    "row_encoding": (
        "benchmarks.studies.row_encoding",
        "recode rows .npz files in place: one-byte bin-exact confidences, `--pack` (a tool of the above)",
    ),
    "row_encoding_check": (
        "benchmarks.studies.row_encoding_check",
        "A's and B's published bootstrap half-widths recomputed from the stored rows (a tool of the above)",
    ),
}


def usage() -> str:
    width = max(map(len, STUDIES))
    lines = ["usage: python -m benchmarks.studies STUDY [ARGS...]   (STUDY --help for its options)", "", "studies:"]
    lines += [f"  {name.ljust(width)}  {what}" for name, (_, what) in STUDIES.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "list"):
        print(usage())
        return 0
    if args[0] not in STUDIES:
        print(f"unknown study {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = STUDIES[args[0]][0]
    sys.argv = [module, *args[1:]]  # run_module sets argv[0] to the module's file
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
