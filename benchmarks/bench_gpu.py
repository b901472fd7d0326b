"""Training throughput of one-go calibration vs plain CE: ResNet-18 on random 32x32 data, one GPU.

    python benchmarks/bench_gpu.py                          # CUDA; writes benchmarks/results/bench_gpu.{json,md}
    python benchmarks/bench_gpu.py --device cpu --steps 2   # tiny CPU smoke test of the code path (writes nothing)

Without a CUDA device (and without --device cpu) it prints "skipped: no CUDA device" and exits 0.

What is measured: the real `calib_core.trainer.Trainer` step loop (`Trainer.train_epoch`, the
loop `fit` runs each epoch, without the per-epoch validation) on an in-memory `DataSplits` of
random tensors (3x32x32 inputs, 10 classes) on the device, for
  * plain CE (method "ce"),
  * one-go, calibrator last_layer, calibrator_data holdout:0.1,
  * one-go, calibrator matrix,     calibrator_data holdout:0.1,
model `create_model("resnet18", 10, (3, 32, 32))`, batch --batch-size, Adam (trainer defaults,
constant lr). The three trainers see the same training split (--steps x --batch-size samples);
their epochs run round-robin (CE, last_layer, matrix, CE, ...) after --warmup untimed epochs
each, with torch.cuda.synchronize() before and after each timed epoch; we report the median of
--repeats epochs. Throughput = training-split samples / epoch time (with holdout:0.1 the
backbone steps on 90% of them and the calibrator on holdout batches, one per backbone step):
the ratio CE / one-go is the wall-time overhead per epoch over the same data. Backbone
samples/s (samples the backbone stepped on) is reported too.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

from benchmarks.common import RESULTS_DIR, command_line, utc_minute, write_json, write_text

DEFAULT_OUT = RESULTS_DIR / "bench_gpu"

VARIANTS = [
    ("plain CE", {"method": "ce"}),
    (
        "one-go last_layer (holdout:0.1)",
        {"method": "onego", "calibrator": "last_layer", "calibrator_data": "holdout:0.1"},
    ),
    ("one-go matrix (holdout:0.1)", {"method": "onego", "calibrator": "matrix", "calibrator_data": "holdout:0.1"}),
]


def main(argv: list[str] | None = None) -> int:
    """Time the variants' epochs round-robin on the device, print (and on CUDA write) the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: smoke test only)")
    p.add_argument(
        "--steps", type=int, default=50, help="CE backbone steps per epoch (training split = steps x batch size)"
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5, help="timed epochs per variant (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed epochs per variant first")
    p.add_argument("--model", default="resnet18")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output prefix (writes .json and .md); default benchmarks/results/bench_gpu on CUDA, nothing on cpu",
    )
    args = p.parse_args(argv)
    command = command_line(__file__, argv)

    import torch

    use_cuda = args.device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        print(
            "skipped: no CUDA device (torch.cuda.is_available() is False); run on a GPU machine, or --device cpu for a smoke test"
        )
        return 0
    device = torch.device(args.device)

    from calib_core.config import RunConfig
    from calib_core.data import DataSplits, Split
    from calib_core.models import create_model
    from calib_core.trainer import Trainer

    def sync() -> None:
        if use_cuda:
            torch.cuda.synchronize(device)

    n_train = args.steps * args.batch_size
    g = torch.Generator().manual_seed(0)
    shape = (3, 32, 32)

    def split(n: int) -> Split:
        return Split(torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g))

    data = DataSplits(
        split(n_train),
        split(args.batch_size),
        split(args.batch_size),
        num_classes=10,
        input_shape=shape,
        name="random32",
    )

    trainers = {}
    for name, train in VARIANTS:
        cfg = RunConfig.model_validate(
            {
                "seed": 0,
                "device": str(device),
                "model": {"name": args.model},
                "train": {"epochs": 10_000, "batch_size": args.batch_size, "lr_schedule": "none", **train},
            }
        )
        model = create_model(args.model, 10, shape)
        trainers[name] = Trainer(cfg, data, device, model=model)
    times: dict[str, list[float]] = {k: [] for k in trainers}
    t_all = time.perf_counter()
    for rep in range(args.warmup + args.repeats):
        for name, tr in trainers.items():
            sync()
            t0 = time.perf_counter()
            tr.train_epoch(rep)
            sync()
            dt = time.perf_counter() - t0
            if rep >= args.warmup:
                times[name].append(dt)
    total = time.perf_counter() - t_all

    ce = statistics.median(times["plain CE"])
    rows = []
    for name, tr in trainers.items():
        med = statistics.median(times[name])
        rows.append(
            {
                "variant": name,
                "median_epoch_s": med,
                "epoch_times_s": times[name],
                "samples_per_s": n_train / med,
                "backbone_samples_per_s": len(tr.backbone_idx) / med,
                "backbone_samples": len(tr.backbone_idx),
                "holdout_samples": len(tr.holdout_idx),
                "time_ratio_vs_ce": med / ce,
            }
        )
    dev_name = torch.cuda.get_device_name(device) if use_cuda else platform.processor() or "cpu"
    lines = [
        "# One-go vs plain CE training throughput (ResNet-18, random 3x32x32 data)",
        "",
        f"Command: `{command}`",
        "",
        f"{utc_minute()}; device {dev_name}; torch {torch.__version__}; model {args.model}; "
        f"batch {args.batch_size}; training split {n_train} samples ({args.steps} CE steps/epoch); "
        f"median of {args.repeats} interleaved epochs after {args.warmup} warm-up epoch(s) each; real Trainer step loop; total {total:.1f}s.",
        "",
        "| variant | samples/s (training split) | backbone samples/s | epoch time / CE | median epoch s | backbone / holdout samples |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['samples_per_s']:.0f} | {r['backbone_samples_per_s']:.0f} | {r['time_ratio_vs_ce']:.2f}x "
            f"| {r['median_epoch_s']:.3f} | {r['backbone_samples']} / {r['holdout_samples']} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out if args.out is not None else (DEFAULT_OUT if use_cuda else None)
    if out is not None:
        write_text(out.with_suffix(".md"), text)
        write_json(
            out.with_suffix(".json"),
            {
                "command": command,
                "device": dev_name,
                "torch": torch.__version__,
                "args": {k: str(v) for k, v in vars(args).items()},
                "total_s": total,
                "rows": rows,
            },
        )
        print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
