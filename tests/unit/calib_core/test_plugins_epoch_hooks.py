"""calib_core.plugins.on_epoch_end: the seam a plugin (and the fault-injection tests) use to act after each epoch
of a sweep's trial; tests/e2e/test_sweep_faults.py shows a hook runs in the trial process (its kill is the fault)."""

from __future__ import annotations

from calib_core import plugins


def test_hooks_register_once_in_order_and_return_the_function(monkeypatch):
    monkeypatch.setattr(plugins, "_EPOCH_HOOKS", [])
    seen: list[tuple[str, int]] = []

    @plugins.on_epoch_end
    def first(epoch: int) -> None:
        seen.append(("first", epoch))

    def second(epoch: int) -> None:
        seen.append(("second", epoch))

    assert plugins.on_epoch_end(second) is second
    plugins.on_epoch_end(first)  # registering again changes nothing
    for hook in plugins.epoch_hooks():
        hook(3)
    assert seen == [("first", 3), ("second", 3)]
    plugins.epoch_hooks().clear()  # a copy: the registry is unchanged
    assert len(plugins.epoch_hooks()) == 2
