"""The lost-node line (sweeps/integrations/ray/node_loss.py) against a hand-made node table and trials."""

from __future__ import annotations

from types import SimpleNamespace

from sweeps.integrations.ray.node_loss import NodeLossCallback

HEAD, WORKER = "a" * 56, "b1c2d3e4" + "f" * 48


def _node(nid: str, alive: bool) -> dict:
    return {"NodeID": nid, "Alive": alive, "NodeManagerAddress": "10.0.0.7" if nid == WORKER else "10.0.0.1"}


def _trial(tid: str, node: str | None, status: str = "RUNNING", cal: str = "vector") -> SimpleNamespace:
    result = {"node_id": node} if node else {}
    config = {"calibrator": cal, "calibrator_lr": 0.06}
    return SimpleNamespace(trial_id=tid, last_result=result, status=status, config=config)


def test_one_line_per_lost_node_naming_its_unfinished_trials():
    table = [[_node(HEAD, True), _node(WORKER, True)]]
    said: list[str] = []
    now = [0.0]
    cb = NodeLossCallback(2, every_s=2.0, nodes=lambda: table[0], say=said.append, clock=lambda: now[0])
    cb.setup()
    trials = [_trial("t1", WORKER), _trial("t2", HEAD), _trial("t3", WORKER, status="TERMINATED")]
    cb.on_step_end(1, trials)
    assert said == []
    table[0] = [_node(HEAD, True), _node(WORKER, False)]
    now[0] = 1.0
    cb.on_step_end(2, trials)  # read at most every 2 s: not yet
    assert said == []
    now[0] = 2.5
    cb.on_step_end(3, trials)
    assert said == [
        "Ray node 10.0.0.7 (b1c2d3e4) lost with 1 trial(s) running on it (vector lr=6.0e-02); it retries from the "
        "last checkpoint on the remaining nodes (resources.max_failures = 2)"
    ]
    cb.on_trial_recover(4, trials, trials[0])  # the same loss, seen again: no second line
    now[0] = 10.0
    cb.on_step_end(5, trials)
    assert len(said) == 1 and cb.lost == [WORKER]


def test_a_node_dead_before_the_sweep_and_a_node_without_trials():
    table = [[_node(HEAD, True), _node(WORKER, False)]]
    said: list[str] = []
    cb = NodeLossCallback(0, nodes=lambda: table[0], say=said.append)
    cb.setup()
    cb.on_trial_error(1, [], _trial("t1", HEAD))
    assert said == []  # dead before the sweep began: nothing this sweep lost
    table[0] = [_node(HEAD, False), _node(WORKER, False)]
    cb.on_trial_error(2, [_trial("t1", HEAD, status="ERROR")], _trial("t1", HEAD))
    assert said == [
        "Ray node 10.0.0.1 (aaaaaaaa) lost with 1 trial(s) running on it (vector lr=6.0e-02); "
        "no retries (resources.max_failures = 0): continue with --resume"
    ]
    table[0] = [_node(HEAD, True), _node(WORKER, True)]
    cb2 = NodeLossCallback(2, nodes=lambda: table[0], say=said.append)
    cb2.setup()
    table[0] = [_node(HEAD, True), _node(WORKER, False)]
    cb2.on_trial_recover(1, [_trial("t1", HEAD)], _trial("t1", HEAD))
    assert said[-1] == "Ray node 10.0.0.7 (b1c2d3e4) lost; no trial of this sweep was running on it"


def test_an_unreachable_node_table_is_no_error():
    def boom() -> list:
        raise ConnectionError("GCS down")

    cb = NodeLossCallback(2, nodes=boom, say=lambda line: None)
    cb.setup()
    cb.on_step_end(1, [])
    assert cb.lost == []


def test_a_trial_restarted_elsewhere_before_the_node_is_marked_dead_is_still_named():
    """The GCS marks a node dead only after its health checks fail; Tune may have restarted the trial on
    another node (reporting from there) by then: the line still names it."""
    table = [[_node(HEAD, True), _node(WORKER, True)]]
    said: list[str] = []
    cb = NodeLossCallback(2, every_s=0.0, nodes=lambda: table[0], say=said.append)
    cb.setup()
    t1, t2 = _trial("t1", None), _trial("t2", None, cal="temperature")
    cb.on_trial_result(1, [t1, t2], t1, {"node_id": WORKER})
    cb.on_trial_result(1, [t1, t2], t2, {"node_id": HEAD})
    cb.on_trial_recover(2, [t1, t2], t1)  # the worker died; its node still looks alive
    assert said == []
    cb.on_trial_result(3, [t1, t2], t1, {"node_id": HEAD})  # restarted on the head from its checkpoint
    table[0] = [_node(HEAD, True), _node(WORKER, False)]
    cb.on_step_end(4, [t1, t2])
    assert said == [
        "Ray node 10.0.0.7 (b1c2d3e4) lost with 1 trial(s) running on it (vector lr=6.0e-02); it retries from the "
        "last checkpoint on the remaining nodes (resources.max_failures = 2)"
    ]
