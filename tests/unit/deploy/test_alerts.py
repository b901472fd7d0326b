"""Alerts (issue #46 item 1): the PrometheusRule of components/monitoring, as the gpu-cluster overlay renders it, passes
`promtool check rules`, and `promtool test rules` (tests/unit/deploy/promtool/alerts_test.yaml) has a firing and a
silent case for every alert; a planted broken expression (a wrong threshold, a syntax error) fails them. promtool
comes from Debian's `prometheus` package (the test set-up installs it: .ci/run, `make setup-promtool`); without it
these tests fail saying so, they do not skip."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests import deploy_render as dr

TESTS = Path(__file__).parent / "promtool" / "alerts_test.yaml"
INSTALL = "apt-get update && apt-get install -y --no-install-recommends prometheus  (or: make setup-promtool)"


def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail(f"promtool is not installed (Debian's prometheus package ships it): {INSTALL}", pytrace=False)
    return exe


def rendered_rules() -> dict:
    resources = dr.render(dr.DEPLOY / "overlays" / "gpu-cluster")
    rules = [r for r in resources if r["kind"] == "PrometheusRule"]
    assert [r["metadata"]["name"] for r in rules] == ["calib-sweeps-alerts"], "monitoring is on in production"
    return {"groups": rules[0]["spec"]["groups"]}


def run_promtool(tmp: Path, rules: dict) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    (tmp / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(TESTS, tmp / "alerts_test.yaml")
    exe = promtool()
    check = subprocess.run([exe, "check", "rules", "rules.yaml"], cwd=tmp, capture_output=True, text=True)
    test = subprocess.run([exe, "test", "rules", "alerts_test.yaml"], cwd=tmp, capture_output=True, text=True)
    return check, test


ALERTS = {
    "CalibSweepsBackupFailed",
    "CalibSweepsBackupMissing",
    "CalibSweepsCertificateExpiring",
    "CalibSweepsRayJobFailed",
    "CalibSweepsGpuWorkerPending",
    "CalibSweepsMLflowDown",
    "CalibSweepsMLflowErrors",
    "CalibSweepsMLflowMetricsDown",
    "CalibSweepsPostgresDown",
}


def test_every_alert_passes_promtool_check_and_its_unit_tests(tmp_path):
    rules = rendered_rules()
    assert {r["alert"] for g in rules["groups"] for r in g["rules"]} == ALERTS
    check, test = run_promtool(tmp_path, rules)
    assert check.returncode == 0, check.stdout + check.stderr
    assert test.returncode == 0, test.stdout + test.stderr
    # every alert has a firing case and a silent one
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    for alert in ALERTS:
        runs = [t for case in cases for t in case.get("alert_rule_test", []) if t["alertname"] == alert]
        assert any(t["exp_alerts"] for t in runs) and any(not t["exp_alerts"] for t in runs), alert


def test_a_planted_wrong_threshold_fails_the_unit_tests(tmp_path):
    """Each alert's expression made never true (one promtool run for all): each alert's firing case reports it."""
    rules = rendered_rules()
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        rule["expr"] = f"({rule['expr']}) and on() vector(0) > 1"
    check, test = run_promtool(tmp_path, rules)
    assert check.returncode == 0, check.stdout + check.stderr
    assert test.returncode != 0
    failed = {a for a in ALERTS if f"alertname: {a}," in test.stdout + test.stderr}
    assert failed == ALERTS, sorted(ALERTS - failed)


def test_a_planted_syntax_error_fails_the_check(tmp_path):
    rules = rendered_rules()
    rules["groups"][0]["rules"][0]["expr"] = "max by (namespace (kube_job_status_failed > 0"
    check, _ = run_promtool(tmp_path, rules)
    assert check.returncode != 0 and "parse error" in (check.stdout + check.stderr).lower()
