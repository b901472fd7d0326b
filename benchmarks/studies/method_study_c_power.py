"""Protocol C's power calculation, from protocol A's measured spread (issue #31).

    python -m benchmarks.studies.method_study_c_power   # prints the table quoted in benchmarks/studies/protocols/method_study_c.md

Reads only `benchmarks/results/method_study_v2a.json` (gzipped: `.json.gz`; A's per-seed test metrics). For each primary
contrast of protocol C it takes the standard deviation over A's 24 evaluation seeds of the paired
difference of the closest pair of methods A has (proxies, named in the table), and computes with a normal
approximation:
- the power of the equivalence test (TOST) at a true difference of 0 against the protocol's margin;
- the minimal detectable difference (80 % power) of a one-sided superiority test;
both at the Holm step with the smallest alpha (alpha / number of regimes), so for every regime;
for the crossed design of protocol C (3 tuning replicates x 24 evaluation seeds) with a replicate-level
standard deviation sigma_rep that A cannot measure (one tuning draw): the standard error of a contrast's
mean is sqrt(sigma_rep^2 / R + sd_seed^2 / S) (seed effects are shared by the replicates, so the seed term
is not divided by R: conservative).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks.common import read_json

ROOT = Path(__file__).resolve().parents[2]
A_JSON = ROOT / "benchmarks" / "results" / "method_study_v2a.json"
REGIMES = ("overconf", "noise20", "imbalance10", "mtl")
METRICS = {"ece": 0.01, "debiased_l2_ce": 0.01, "nll": 0.03, "accuracy": 0.01}  # protocol C's margins
# protocol C's contrast -> protocol A's closest pair of methods (A never stacked TS on a tuned backbone)
PROXIES = {
    "onego_ts vs ce_es+TS": ("onego_ts", "ts_val"),
    "onego_ts+TS vs ce_es+TS": ("onego_ts", "ts_val"),
    "onego_ts vs ce_es": ("onego_ts", "ce_es"),
    "onego_ll vs ce_es+TS": ("onego_ll", "ts_val"),
}


def _z(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


def tost_power(se: float, margin: float, alpha: float) -> float:
    """P(both one-sided (1 - alpha) bounds inside +-margin) at a true difference of 0 (normal approximation)."""
    if se <= 0:
        return 1.0
    nd = statistics.NormalDist()
    return max(0.0, 2.0 * nd.cdf(margin / se - _z(1.0 - alpha)) - 1.0)


def noninferiority_power(se: float, margin: float, alpha: float) -> float:
    """P(the one-sided (1 - alpha) lower bound is above -margin) at a true difference of 0."""
    if se <= 0:
        return 1.0
    return statistics.NormalDist().cdf(margin / se - _z(1.0 - alpha))


def mdd(se: float, alpha: float, power: float = 0.8) -> float:
    """The smallest true difference a one-sided level-alpha test detects with `power`."""
    return (_z(1.0 - alpha) + _z(power)) * se


def table(seeds: int = 24, replicates: int = 3, alpha: float = 0.05, rep_fracs=(0.0, 0.5)) -> list[dict]:
    """One row per contrast, metric, regime and replicate-sd scenario (sigma_rep = frac x margin)."""
    methods = read_json(A_JSON)["methods"]  # or its gzipped form beside it
    a_step = alpha / len(REGIMES)  # Holm's first (strictest) step
    rows = []
    for contrast, (m, ref) in PROXIES.items():
        for metric, margin in METRICS.items():
            for r in REGIMES:
                a, b = methods[f"{r}/{m}"], methods[f"{r}/{ref}"]
                d = [a[s][metric] - b[s][metric] for s in a if s in b]
                sd = statistics.stdev(d)
                for frac in rep_fracs:
                    se = math.sqrt((frac * margin) ** 2 / replicates + sd**2 / seeds)
                    rows.append(
                        {
                            "contrast": contrast,
                            "proxy": f"{m} - {ref}",
                            "metric": metric,
                            "regime": r,
                            "sd_seed": sd,
                            "sigma_rep": frac * margin,
                            "se": se,
                            "power": (noninferiority_power if metric == "accuracy" else tost_power)(se, margin, a_step),
                            "mdd80": mdd(se, a_step),
                        }
                    )
    return rows


def main() -> int:
    rows = table()
    print(
        "Power at a true difference of 0 (TOST; accuracy: non-inferiority), per regime, sigma_rep = 0 / 0.5 x margin;"
    )
    print("MDD: minimal detectable difference of a one-sided test at 80 % power (sigma_rep = 0). Holm's first step.")
    print()
    print("| contrast (A's proxy pair) | metric (margin) | " + " | ".join(REGIMES) + " |")
    print("|---|---|" + "---|" * len(REGIMES))
    keyed = {(x["contrast"], x["metric"], x["regime"], x["sigma_rep"] > 0): x for x in rows}
    for contrast, (m, ref) in PROXIES.items():
        for metric, margin in METRICS.items():
            scale, unit = (1.0, "nats") if metric == "nll" else (100.0, "pt")
            cells = []
            for r in REGIMES:
                a, b = keyed[(contrast, metric, r, False)], keyed[(contrast, metric, r, True)]
                cells.append(
                    f"sd {scale * a['sd_seed']:.3g}: {a['power']:.2f} / {b['power']:.2f}; MDD {scale * a['mdd80']:.3g}"
                )
            print(f"| {contrast} ({m} - {ref}) | {metric} ({scale * margin:g} {unit}) | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
