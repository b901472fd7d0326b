"""Where a sweep's time and memory went: one clock over its phases, and the timing line it ends with."""

from __future__ import annotations

import resource
import time


def peak_rss_mb() -> float:
    """The driver process's peak resident memory so far, MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


# The timing line's first phase: from Ray's start to Ray Tune's fit (Ray with the MLflow store beside it, the study,
# the tuner; the Start-up line itemises it). Lines recorded before 2026-12-06 call it "Ray start": the benchmarks
# that read recorded lines (benchmarks/perf) accept both through START_PATTERN.
START_WORDS = "start (Ray, stores, tuner)"
START_PATTERN = r"Timing: (?:Ray start|start \(Ray, stores, tuner\))"


class PhaseClock:
    """One timer for the sweep's phases: when each ended, and the driver's peak RSS then."""

    # (phase, its key in SweepResult.timings, its peak-RSS key), in the order the phases run: the champion is
    # registered (and printed) before every other metric's intervals and the report files are made
    PHASES = (
        ("ray_start", "ray_start_s", "fit"),
        ("trials", "trials_s", "trials"),
        ("closing", "closing_s", "closed"),
        ("bootstrap", "bootstrap_s", "reps"),
        ("select", "select_s", "select"),
        ("registration", "registration_s", "registered"),
        ("report", "report_s", "end"),
    )

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.ends: dict[str, float] = {}
        self.rss_mb: dict[str, float] = {}

    def end(self, phase: str) -> None:
        """Phase `phase` (one of PHASES) ends now."""
        if phase not in {p for p, _, _ in self.PHASES}:
            raise ValueError(f"unknown phase {phase!r}: one of {', '.join(p for p, _, _ in self.PHASES)}")
        self.ends[phase] = time.perf_counter()
        self.rss_mb[phase] = peak_rss_mb()

    def seconds(self, phase: str) -> float:
        """How long `phase` took (from the end of the phase before it)."""
        names = [p for p, _, _ in self.PHASES]
        before = [self.ends[p] for p in names[: names.index(phase)] if p in self.ends]
        return self.ends[phase] - (before[-1] if before else self.started)

    def timings(self) -> dict[str, float]:
        """SweepResult.timings: each phase's seconds, everything after the last trial (selection_registration_s)
        and up to the champion's registration (champion_s), peak RSS by phase."""
        out = {key: self.seconds(p) for p, key, _ in self.PHASES}
        out["selection_registration_s"] = self.ends["report"] - self.ends["trials"]
        out["champion_s"] = self.ends["registration"] - self.ends["trials"]
        out.update({f"peak_rss_mb_{rss}": self.rss_mb[p] for p, _, rss in self.PHASES})
        return out

    def line(self) -> str:
        """The sweep's last line: where the time went, and the driver's memory."""
        s, t = self.seconds, self.timings()
        return (
            f"Timing: {START_WORDS} {s('ray_start'):.1f}s, trials {s('trials'):.1f}s, "
            f"selection and registration {t['selection_registration_s']:.1f}s "
            f"(closing the trials {s('closing'):.1f}s, bootstrap {s('bootstrap'):.1f}s, rule {s('select'):.1f}s, "
            f"registration {s('registration'):.1f}s, report files {s('report'):.1f}s); the champion "
            f"{t['champion_s']:.1f}s after the last trial; driver peak RSS {self.rss_mb['report'] / 1e3:.2f} GB "
            f"({self.rss_mb['trials'] / 1e3:.2f} GB before selection)"
        )
