"""What a rule decided: the champion, how it judged every candidate, and the sentence made from that judgement.

A rule's sentence reads its `Choice` (never recomputes its own criterion), and the leaderboard writes the same
standings (sweeps.contract BOARD_* columns): what the sentence counts is what the file shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sweeps.selection_rules.base import TrialRecord


@dataclass(frozen=True)
class Standing:
    """How the rule judged one candidate."""

    accuracy_gap: float  # the most accurate candidate's val accuracy minus this one's (point estimates, >= 0)
    eligible: bool  # in the set the rule picks from
    lower_bound: float | None = None  # one-sided lower confidence bound of (this - most accurate) val accuracy
    p_value: float | None = None  # one-sided p of "less accurate than the most accurate"


@dataclass(frozen=True)
class Choice:
    """A rule's decision: its champion, the most accurate candidate, every candidate's standing, the sentence."""

    champion: TrialRecord
    most_accurate: TrialRecord
    standings: dict[str, Standing] = field(repr=False)
    sentence: str = ""

    def eligible(self, ok: list[TrialRecord]) -> list[TrialRecord]:
        """The candidates of `ok` in the set the rule picked from, in their order."""
        return [r for r in ok if self.standings[r.trial_id].eligible]
