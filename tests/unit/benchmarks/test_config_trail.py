"""benchmarks/perf/config_trail.py's counting, on a hand-made trail."""

from __future__ import annotations

from benchmarks.perf import config_trail as ct


def test_stays_returns_and_start_up_counted_by_hand():
    calls = [
        ["sweeps/startup.py", "check_all"],
        ["sweeps/checks/preflight.py", "check_config"],
        ["sweeps/checks/preflight.py", "check_local_data"],  # same file, same stay
        ["sweeps/startup.py", "_environment"],  # back: a return
        ["sweeps/integrations/ray/tuner.py", "build_tuner"],  # the tuner: start-up ends before it
        ["sweeps/checks/preflight.py", "search_space"],  # a return
        ["sweeps/finish.py", "build_result"],
    ]
    trail = ct.stays(calls)
    assert [(s["file"].rsplit("/", 1)[1], s["return"]) for s in trail] == [
        ("startup.py", False),
        ("preflight.py", False),
        ("startup.py", True),
        ("tuner.py", False),
        ("preflight.py", True),
        ("finish.py", False),
    ]
    assert trail[1]["functions"] == ["check_config", "check_local_data"]
    assert ct.summary(trail) == {"stays": 6, "files": 4, "returns": 2}
    assert ct.summary(ct.stays(ct.start_up(calls))) == {"stays": 3, "files": 2, "returns": 1}
