"""A selection rule as configs and people see it (`RuleSpec`), and the settings every rule may read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

# Settings every rule may read: what it minimises or maximises and how the bootstrap judges differences.
SHARED = ("metric", "mode", "confidence", "num_resamples")


class Settings(BaseModel):
    """A rule's own settings (subclass it: defaults, bounds, descriptions); they sit flat in `selection.*`."""

    model_config = ConfigDict(extra="forbid")


class NoSettings(Settings):
    """A rule with no setting of its own."""


# (the completed candidates, the selection config, the bootstrap replicates or None) -> choice.Choice: the champion,
# every candidate's standing and the sentence made from them
Pick = Callable[[list[Any], Any, Any], Any]


@dataclass(frozen=True)
class RuleSpec:
    """One selection rule: its name, what it does in a sentence, its own settings (a model: defaults, bounds,
    descriptions), the shared settings it also reads, whether it needs the bootstrap replicates (read once every
    trial finished), the function that picks, and its place in the table people read."""

    name: str
    summary: str
    settings: type[BaseModel]
    shared: tuple[str, ...]
    needs_replicates: bool
    pick: Pick
    order: int

    @property
    def reads(self) -> tuple[str, ...]:
        """Every selection.* setting the rule reads: its own, then the shared ones."""
        return (*self.settings.model_fields, *self.shared)
