"""Re-apply and upgrade safe (issue #46 item 4): every Job is named after its spec by `release.py render/apply`
(a new release makes new Jobs instead of failing on an immutable pod template; an unchanged one keeps its name),
the README's deploy step (`make deploy` = `release.py apply`) refuses placeholders before kubectl sees anything,
and refuses to change a RayJob that is still running (KubeRay builds each retry from the current spec)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import yaml

from deploy import release
from tests import deploy_render as dr

OVERLAYS = dr.overlay_dirs()
IDS = [p.name for p in OVERLAYS]
DIGEST = "sha256:" + "ab" * 32


def jobs(resources: list[dict]) -> dict[str, dict]:
    return {r["metadata"]["labels"][release.JOB_LABEL]: r for r in resources if r["kind"] == "Job"}


def pinned(tmp: Path, overlay: Path, digest: str = DIGEST, mlflow_digest: str = DIGEST) -> Path:
    """OVERLAY wrapped with our images pinned (as `release` leaves it)."""
    d = tmp / f"pinned-{overlay.name}-{digest[-6:]}-{mlflow_digest[-6:]}"
    d.mkdir(parents=True)
    (d / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(overlay, d)],
                "images": [
                    {"name": f"registry.example.com/calib-sweeps/{n}", "digest": dg}
                    for n, dg in (("ray", digest), ("mlflow", mlflow_digest))
                ]
                + [
                    {"name": f"localhost:5001/calib-sweeps/{n}", "digest": dg}
                    for n, dg in (("ray", digest), ("mlflow", mlflow_digest))
                ],
            }
        )
    )
    return d


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_every_job_is_named_after_its_spec(tmp_path, overlay):
    plain = dr.render(overlay)
    named = release.name_jobs_by_spec(plain)
    before = jobs(named)
    assert before, "the overlay has Jobs"
    for base, job in before.items():
        assert job["metadata"]["name"] == f"{base}-{release.job_spec_hash(job)}"
        assert len(job["metadata"]["name"]) <= 63
        # every Job goes away by itself, so the renamed old ones do not pile up
        assert job["spec"]["ttlSecondsAfterFinished"] <= 7 * 86400, base
    # stable: the same render names them the same; renaming twice changes nothing
    assert jobs(release.name_jobs_by_spec(dr.render(overlay))).keys() == before.keys()
    assert {b: j["metadata"]["name"] for b, j in jobs(release.name_jobs_by_spec(named)).items()} == {
        b: j["metadata"]["name"] for b, j in before.items()
    }
    # metadata alone (an annotation) does not rename; any change of the spec does
    for base, job in before.items():
        again = json.loads(json.dumps(job))
        del again["metadata"]["labels"][release.JOB_LABEL]
        again["metadata"]["name"] = base
        again["metadata"].setdefault("annotations", {})["note"] = "x"
        assert release.name_jobs_by_spec([again])[0]["metadata"]["name"] == job["metadata"]["name"]
        again["spec"]["template"]["spec"]["containers"][0]["image"] += "x"
        assert release.name_jobs_by_spec([again])[0]["metadata"]["name"] != job["metadata"]["name"]
    # no other object is renamed
    assert [dr.resource_id(r) for r in named if r["kind"] != "Job"] == [
        dr.resource_id(r) for r in plain if r["kind"] != "Job"
    ]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_a_new_release_renames_exactly_the_jobs_it_changes(tmp_path, overlay):
    """Rendered end to end: a new MLflow image digest renames every Job running the MLflow image (the sweep's user,
    dev's buckets and optuna database) and no other; the same release rendered again keeps every name."""
    first = jobs(release.name_jobs_by_spec(dr.render(pinned(tmp_path, overlay))))
    same = jobs(release.name_jobs_by_spec(dr.render(pinned(tmp_path / "again", overlay))))
    assert {b: j["metadata"]["name"] for b, j in first.items()} == {b: j["metadata"]["name"] for b, j in same.items()}
    new = jobs(release.name_jobs_by_spec(dr.render(pinned(tmp_path, overlay, mlflow_digest="sha256:" + "cd" * 32))))
    for base, job in first.items():
        images = {c["image"] for c in job["spec"]["template"]["spec"]["containers"]}
        uses_mlflow = any("calib-sweeps/mlflow" in i for i in images)
        assert (new[base]["metadata"]["name"] != job["metadata"]["name"]) == uses_mlflow, base
    assert any(
        "calib-sweeps/mlflow" in c["image"] for j in first.values() for c in j["spec"]["template"]["spec"]["containers"]
    )


# ------------------------------------------------------------------------------- the deploy step


def _stand_in_kubectl(bin_dir: Path, log: Path, rayjobs: list[dict] | None = None) -> Path:
    """A kubectl that records each call (and what `apply -f -` read) and answers `get rayjobs` with RAYJOBS."""
    bin_dir.mkdir(exist_ok=True)
    answer = bin_dir / "rayjobs.json"
    answer.write_text(json.dumps({"items": rayjobs or []}))
    exe = bin_dir / "kubectl"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import sys, json\n"
        f"log = open({str(log)!r}, 'a')\n"
        "log.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1:2] == ['get']:\n"
        f"    print(open({str(answer)!r}).read())\n"
        "elif sys.argv[1:2] == ['apply']:\n"
        "    log.write(json.dumps({'stdin': sys.stdin.read()}) + '\\n')\n"
    )
    exe.chmod(stat.S_IRWXU)
    return exe


def _calls(log: Path) -> list:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _applyable(tmp: Path) -> Path:
    """The gpu-cluster overlay as a user leaves it before the deploy step: addresses set, images released."""
    root = tmp / "repo"
    shutil.copytree(dr.DEPLOY, root / "deploy", ignore=shutil.ignore_patterns("secrets.yaml", "*.pyc"))
    overlay = root / "deploy" / "overlays" / "gpu-cluster"
    for f in (overlay / "patches" / "egress-addresses.yaml", overlay / "networkpolicy-egress.yaml"):
        f.write_text(dr.with_addresses(f.read_text()))
    text = (overlay / "kustomization.yaml").read_text()
    (overlay / "kustomization.yaml").write_text(text.replace(release.PLACEHOLDER, DIGEST))
    return overlay


def test_the_deploy_step_refuses_a_placeholder_digest_before_kubectl(tmp_path, capsys):
    log = tmp_path / "kubectl.log"
    kubectl = _stand_in_kubectl(tmp_path / "bin", log)
    overlay = _applyable(tmp_path)
    text = (overlay / "kustomization.yaml").read_text()
    # one digest back to the placeholder: refused, and kubectl never called
    (overlay / "kustomization.yaml").write_text(text.replace(DIGEST, release.PLACEHOLDER, 1))
    assert release.main(["apply", str(overlay), "--kubectl", str(kubectl)]) == 1
    err = capsys.readouterr().err
    assert "placeholder digest of our image" in err and "nothing applied" in err
    assert _calls(log) == []
    # the repository's overlay as committed: placeholder digests and address ranges, refused as well
    assert release.main(["apply", str(dr.DEPLOY / "overlays" / "gpu-cluster"), "--kubectl", str(kubectl)]) == 1
    err = capsys.readouterr().err
    assert "placeholder address range" in err and "placeholder digest" in err
    assert _calls(log) == []


def test_the_deploy_step_applies_a_release_with_jobs_named_by_spec(tmp_path):
    log = tmp_path / "kubectl.log"
    kubectl = _stand_in_kubectl(tmp_path / "bin", log)
    overlay = _applyable(tmp_path)
    assert release.main(["apply", str(overlay), "--kubectl", str(kubectl)]) == 0
    calls = _calls(log)
    assert calls[0][:2] == ["get", "rayjobs.ray.io"] and calls[1] == ["apply", "-f", "-"]
    docs = [d for d in yaml.safe_load_all(calls[2]["stdin"]) if d]
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["metadata"]["name"] == f"mlflow-sweep-user-{release.job_spec_hash(job)}"
    assert release.problems(docs, for_apply=True) == []
    # the README's first phase: everything but the sweep
    log.unlink()
    assert (
        release.main(["apply", str(overlay), "-l", "app.kubernetes.io/name!=calib-sweep", "--kubectl", str(kubectl)])
        == 0
    )
    docs = [d for d in yaml.safe_load_all(_calls(log)[-1]["stdin"]) if d]
    kinds = {d["kind"] for d in docs}
    assert "RayJob" not in kinds and "RayCluster" not in kinds and "Deployment" in kinds


@pytest.mark.parametrize(
    ("status", "refused"), [("Running", True), ("Retrying", True), ("Complete", False), ("Failed", False)]
)
def test_the_deploy_step_refuses_to_change_a_running_sweep(tmp_path, capsys, status, refused):
    """KubeRay builds each retry's cluster from the RayJob's current spec: a new release applied while the sweep
    runs would resume its Tune state on the new Ray. `apply` refuses a changed RayJob that has not finished."""
    overlay = _applyable(tmp_path)
    rendered = release.render(overlay)
    live = json.loads(json.dumps(next(r for r in rendered if r["kind"] == "RayJob")))
    live["status"] = {"jobDeploymentStatus": status}
    unchanged = _stand_in_kubectl(tmp_path / "same", tmp_path / "same.log", [live])
    assert release.main(["apply", str(overlay), "--kubectl", str(unchanged)]) == 0  # the same spec: nothing changes
    live["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = "old@" + DIGEST
    log = tmp_path / "kubectl.log"
    kubectl = _stand_in_kubectl(tmp_path / "bin", log, [live])
    assert release.main(["apply", str(overlay), "--kubectl", str(kubectl)]) == (1 if refused else 0)
    assert any(c == ["apply", "-f", "-"] for c in _calls(log)) != refused
    if refused:
        assert "next retry would resume the sweep on the new spec" in capsys.readouterr().err
        log.unlink()
        assert release.main(["apply", str(overlay), "--kubectl", str(kubectl), "--allow-running-sweep"]) == 0
        assert ["apply", "-f", "-"] in _calls(log)


def test_make_deploy_goes_through_release_apply():
    makefile = (dr.REPO_ROOT / "Makefile").read_text()
    assert "\ndeploy:" in makefile and "deploy/release.py apply $(OVERLAY)" in makefile
    readme = (dr.DEPLOY / "README.md").read_text()
    step = readme[readme.index("## 4. Deploy") : readme.index("## 5. Follow the sweep")]
    assert "make deploy" in step
    commands = [line.strip() for line in step.splitlines() if line.strip().startswith("kubectl apply")]
    assert commands == [], commands  # no bypass of the checks in the step people run
