"""Launch a calibration sweep: `python sweeps/launch.py [--cluster] [--config FILE] [--set k=v ...]`.

Locally with no flags it sweeps the embedded MNIST-1D demo on this machine's CPUs and records
everything in ./mlflow.db; with --cluster it joins the running Ray cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from calib_core.config import ConfigError, clip
from calib_core.redaction import redact, redact_text, redact_values
from sweeps.selection_rules import describe as describe_rules
from sweeps.start_steps import SIGNALS, Startup

if TYPE_CHECKING:
    from sweeps.config import SweepConfig

EXIT_OK, EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED = 0, 2, 1, 130
ERROR_LINE_CHARS = 300  # an error line is read by a person: longer ones are cut, saying so


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (`error: ...`), exit 2."""

    def error(self, message: str) -> NoReturn:
        text = clip(redact_text(" ".join(message.split())), ERROR_LINE_CHARS - len("error:  (see --help)"))
        print(f"error: {text} (see --help)", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface (every flag explained in --help)."""
    p = _Parser(
        prog="python sweeps/launch.py",
        description="Sweep calibrators and calibrator learning rates with Ray Tune + Optuna; "
        "track in MLflow; select and register the best model (validation metrics only).",
        # the rules as their table has them (sweeps/selection_rules/), kept as written
        epilog="selection rules (--set selection.rule=NAME):\n" + describe_rules(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="sweep YAML (default: sweeps/configs/mnist1d_demo.yaml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value by dotted key, e.g. --set run.train.epochs=2 (repeatable)",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="connect to an existing Ray cluster (RAY_ADDRESS or 'auto'); storage and "
        "tracking must then be reachable from every node",
    )
    p.add_argument("--num-samples", type=int, metavar="N", help="number of trials (search.num_samples)")
    p.add_argument("--max-concurrent", type=int, metavar="N", help="trials running at once (resources.max_concurrent)")
    p.add_argument("--gpus-per-trial", type=float, metavar="F", help="GPUs per trial, fractions allowed, e.g. 0.25")
    p.add_argument("--cpus-per-trial", type=float, metavar="F", help="CPUs per trial (also sets torch threads)")
    p.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI (default: sqlite:///<cwd>/mlflow.db; a server URL with --cluster)",
    )
    p.add_argument(
        "--storage-path",
        metavar="PATH",
        help="where Ray Tune keeps results and checkpoints (default: <cwd>/ray_results; "
        "s3://... or a shared mount with --cluster)",
    )
    p.add_argument("--name", help="sweep name: Ray experiment name, MLflow parent run and Optuna study name")
    p.add_argument(
        "--model-name",
        metavar="NAME",
        help="registered model the champion goes to (tracking.registered_model; default: named after the data, "
        "with a digest of a data file's content)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the sweep NAME where it stopped (starts it if there is nothing to resume; "
        "says so and changes nothing if it already finished; with --num-samples N above its trial "
        "count, grows it by the difference and selects again)",
    )
    p.add_argument(
        "--promote",
        action="store_true",
        help="move @champion to this sweep's pick even if the champion gate would keep the current one",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config and resource plan, then exit without running anything "
        "(checks values only: not paths, servers or resources)",
    )
    p.add_argument("--seed", type=int, help="seed for data splits, training and the Optuna sampler")
    p.add_argument(
        "--no-reference-arms",
        action="store_true",
        help="no CE-with-early-stopping reference trial and no temperature scaling on top of each trial "
        "(search.references=[], evaluation.temperature_on_top=false): only what Optuna samples competes",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="Ray Tune's full output (every trial's config and result tables) and every library's "
        "log lines, instead of the status table and one progress line per trial",
    )
    return p


def _grows(args: argparse.Namespace) -> bool:
    """`--resume` with a trial count given (--num-samples or --set search.num_samples=N) may grow a finished sweep."""
    return bool(args.resume) and (
        args.num_samples is not None or any(o.split("=", 1)[0].strip() == "search.num_samples" for o in args.overrides)
    )


def resolve_config(args: argparse.Namespace) -> SweepConfig:
    """Config file + --set overrides + CLI flags, validated; defaults made absolute."""
    from sweeps.config import load_sweep_config
    from sweeps.config_defaults import with_defaults

    overrides = list(args.overrides)
    values: dict[str, Any] = {}  # the flags' values as given (no YAML reading: --name 2024 stays a name)
    flag_map = {
        "num_samples": "search.num_samples",
        "max_concurrent": "resources.max_concurrent",
        "gpus_per_trial": "resources.gpus_per_trial",
        "cpus_per_trial": "resources.cpus_per_trial",
        "tracking_uri": "tracking.uri",
        "storage_path": "storage_path",
        "name": "name",
        "model_name": "tracking.registered_model",
    }
    for attr, key in flag_map.items():
        value = getattr(args, attr)
        if value is not None:
            values[key] = value
    if args.seed is not None:
        values.update({"run.seed": args.seed, "search.seed": args.seed})
    if args.no_reference_arms:
        values.update({"search.references": [], "evaluation.temperature_on_top": False})
    cfg = load_sweep_config(args.config, overrides, values)
    return with_defaults(cfg, cluster=args.cluster, workdir=Path.cwd())


def resource_plan(cfg: SweepConfig) -> str:
    """A short human summary of what the sweep will ask Ray for."""
    r, s = cfg.resources, cfg.search
    conc = min(r.max_concurrent, s.num_samples)
    metric = s.metric if s.objective == "single" else "val_accuracy max + val_ece min"
    return (
        f"trials: {s.num_samples} ({s.objective}-objective, metric {metric}, "
        f"scheduler {s.scheduler})\n"
        f"per trial: {r.cpus_per_trial:g} CPU, {r.gpus_per_trial:g} GPU; at most {conc} at once "
        f"-> peak {conc * r.cpus_per_trial:g} CPU, {conc * r.gpus_per_trial:g} GPU\n"
        f"retries per trial: {r.max_failures}; epochs per trial: {cfg.run.train.epochs}\n"
        f"storage: {redact(cfg.storage_path or '')}\ntracking: {redact(cfg.tracking.uri or '')}\n"
        f"optuna study: {cfg.name} in {redact(cfg.search.storage or 'memory')}"
    )


def _fit(parts: list[str], limit: int) -> list[str]:
    """`parts` shortened to fit `limit` characters together: the short ones whole, each long one cut in its middle
    (its start names the field, its end gives the advice), the room shared out evenly."""
    out, room = list(parts), limit
    order = sorted(range(len(parts)), key=lambda j: len(parts[j]))
    for left, i in zip(range(len(parts), 0, -1), order):  # shortest first: what they leave goes to the longer
        share = room // left
        if len(parts[i]) > share:
            head = max(1, (share - 1) * 3 // 5)
            out[i] = parts[i][:head] + "…" + parts[i][len(parts[i]) - max(0, share - 1 - head) :]
        room -= len(out[i])
    return out


def _one_line(exc: BaseException) -> str:
    """The error as one line, every URI in it without its secrets (calib_core/redaction.py); a long one is shortened in
    the middle of each of its '; '-separated parts, never at a part's start (the field) or end (the advice)."""
    text = redact_text(" ".join(str(exc).split())) or type(exc).__name__
    limit = ERROR_LINE_CHARS - len("error: ")
    if len(text) <= limit:
        return text
    parts = text.split("; ")
    return "; ".join(_fit(parts, limit - 2 * (len(parts) - 1)))


def _redacting_excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    """An unexpected error's traceback, as Python prints it but with no URI's password in it."""
    import traceback

    sys.stderr.write(redact_text("".join(traceback.format_exception(kind, exc, tb))))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code.

    Every check that can run before anything is written does (sweeps/checks/preflight.py): a bad
    value, path, server or resource request is one `error:` line on stderr, exit 2, and
    nothing is created (no mlflow.db, mlartifacts, ray_results, or run in an existing store).

    Ctrl+C or SIGTERM at any moment stops it with exit 130 (sweeps/start_steps.py): before the sweep's parent
    run exists nothing was written; after, its runs are KILLED and `--resume` continues it."""
    sys.excepthook = _redacting_excepthook
    startup = Startup()
    seen: dict[str, argparse.Namespace] = {}  # the parsed flags, once parsed
    try:
        with SIGNALS.installed():
            startup.end_imports()
            return _main(argv, startup, seen)
    except KeyboardInterrupt:
        SIGNALS.clear()
        return _interrupted(startup, seen.get("args"))


def _interrupted(startup: Startup, args: argparse.Namespace | None) -> int:
    """The line for a stop signal, by what start-up had made: exit 130."""
    if "store" in startup.ended:  # the sweep's parent run exists: KILLED with its trials' runs
        print("interrupted: runs marked KILLED; continue with --resume", file=sys.stderr)
    elif args is not None and args.resume:
        print("interrupted before the sweep continued; nothing was changed; continue with --resume", file=sys.stderr)
    else:
        print("interrupted before the sweep started; nothing was written", file=sys.stderr)
    return EXIT_INTERRUPTED


def _main(argv: list[str] | None, startup: Startup, seen: dict[str, argparse.Namespace]) -> int:
    """`main` under the stop handlers; a stop signal is raised out of it as KeyboardInterrupt."""
    with startup.step("config"):
        args = seen["args"] = build_parser().parse_args(argv)
        try:
            from sweeps.checks.preflight import check_config

            cfg = resolve_config(args)
            check_config(cfg, cluster=args.cluster)
        except ConfigError as exc:
            print(f"error: {_one_line(exc)}", file=sys.stderr)
            return EXIT_CONFIG
    if args.dry_run:
        import yaml

        print(yaml.safe_dump(redact_values(cfg.model_dump(mode="json")), sort_keys=False).rstrip())
        print("---")
        print(resource_plan(cfg))
        return EXIT_OK
    from sweeps.contract import ResourcesUnavailable
    from sweeps.startup import preflight

    try:
        with startup.step("checks"):
            nothing_to_do = preflight(cfg, cluster=args.cluster, resume=args.resume, grow=_grows(args))
    except ConfigError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_CONFIG
    if nothing_to_do:
        if not args.cluster and cfg.storage_path and "://" not in cfg.storage_path:
            from sweeps.integrations.ray.session import reap_stale

            reap_stale(cfg.storage_path)  # a killed driver's leftovers go on this path too
        print(nothing_to_do)
        return EXIT_OK
    from sweeps.contract import SweepError, SweepIncomplete
    from sweeps.service import execute

    try:
        execute(
            cfg,
            cluster=args.cluster,
            resume=args.resume,
            verbose=args.verbose,
            grow=_grows(args),
            promote=args.promote,
            startup=startup,
        )
    except SweepIncomplete as exc:
        print(redact_text(str(exc)), file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ConfigError, SweepError, ResourcesUnavailable) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_FAILED
    return EXIT_OK
