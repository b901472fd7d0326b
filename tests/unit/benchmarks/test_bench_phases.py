"""benchmarks/perf/bench_phases.py: the Timing lines of both trees read into the same phases (hand-written lines)."""

from __future__ import annotations

import pytest

from benchmarks.perf.bench_phases import parse_timing

# efb685e's line: the champion was printed once every phase had run, registration last
BEFORE = (
    "Timing: Ray start 4.1s, trials 23.4s, selection and registration 13.1s (closing the trials 1.9s, bootstrap "
    "5.7s, rule 0.0s, report files 1.4s, registration 4.1s); driver peak RSS 1.07 GB (0.76 GB before selection)"
)
# today's: registration before the report files, and the champion's own time
AFTER = (
    "Timing: Ray start 3.9s, trials 20.8s, selection and registration 5.2s (closing the trials 1.6s, bootstrap "
    "0.7s, rule 0.0s, registration 0.3s, report files 2.6s); the champion 2.6s after the last trial; driver peak "
    "RSS 1.07 GB (0.76 GB before selection)"
)


def test_the_old_line_s_champion_came_after_every_phase():
    got = parse_timing(f"Leaderboard ...\n{BEFORE}\n")
    assert got["Ray start"] == 4.1 and got["trials"] == 23.4 and got["registration"] == 4.1
    assert got["after_last_trial"] == pytest.approx(1.9 + 5.7 + 0.0 + 1.4 + 4.1)
    assert got["champion_after_last_trial"] == got["after_last_trial"]


def test_the_new_line_s_champion_is_its_own_figure_and_the_sum_is_not_a_phase():
    got = parse_timing(AFTER)
    assert got["registration"] == 0.3  # not the 5.2 s of "selection and registration"
    assert got["closing the trials"] == 1.6 and got["trials"] == 20.8
    assert got["after_last_trial"] == pytest.approx(1.6 + 0.7 + 0.0 + 0.3 + 2.6)
    assert got["champion_after_last_trial"] == 2.6


def test_no_timing_line_is_said():
    with pytest.raises(SystemExit, match="no Timing line"):
        parse_timing("Registered: models:/x@champion (version 1)\n")
