"""Kustomize rendering (tests/deploy_render.py): the deploy tests render through `render`, which
prefers the real `kubectl kustomize` and falls back to the small Python renderer. Every case here
runs through both renderers (the kubectl one where kubectl is installed) with the same expectations,
and the fallback must render every overlay exactly as kubectl does: where they disagree, kubectl
is right."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from tests import deploy_render as dr

RENDERERS = {"python": dr.build, "kubectl": dr.kubectl_build}


def _need_kubectl() -> None:
    exe, why = dr.find_kubectl()
    if exe is None:
        pytest.skip(f"no usable kubectl ({why}): only the Python renderer is checked")


@pytest.fixture(params=sorted(RENDERERS))
def build(request):
    """The renderer under test: each case runs with the Python renderer and with kubectl kustomize."""
    if request.param == "kubectl":
        _need_kubectl()
    return RENDERERS[request.param]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


DEPLOYMENT = """\
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: web
    spec:
      selector:
        matchLabels: {app: web}
      template:
        metadata:
          labels: {app: web}
        spec:
          containers:
            - name: web
              image: example/web:1.0
              env:
                - {name: A, value: "1"}
                - {name: B, value: "2"}
              envFrom:
                - configMapRef: {name: settings}
            - name: sidecar
              image: example/sidecar
    """

RAYJOB = """\
    apiVersion: ray.io/v1
    kind: RayJob
    metadata:
      name: job
    spec:
      entrypoint: python main.py
      rayClusterSpec:
        headGroupSpec:
          template:
            spec:
              containers:
                - name: head
                  image: example/web:1.0
                  env: [{name: A, value: "1"}, {name: B, value: "2"}]
    """


def test_strategic_merge_lists_by_name_and_deletes(tmp_path, build):
    _write(
        tmp_path,
        {
            "base/kustomization.yaml": "resources: [deploy.yaml]\n",
            "base/deploy.yaml": DEPLOYMENT,
            "over/kustomization.yaml": """\
            resources: [../base]
            namespace: team
            patches:
              - path: patch.yaml
            """,
            "over/patch.yaml": """\
            apiVersion: apps/v1
            kind: Deployment
            metadata: {name: web}
            spec:
              template:
                spec:
                  containers:
                    - name: web
                      env:
                        - {name: B, value: "20"}
                        - {name: C, value: "3"}
                    - name: sidecar
                      $patch: delete
            """,
        },
    )
    (dep,) = build(tmp_path / "over")
    assert dep["metadata"]["namespace"] == "team"
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["web"]
    # kustomize's order: the patch's items first (in the patch's order), then the base's others.
    assert containers[0]["env"] == [
        {"name": "B", "value": "20"},
        {"name": "C", "value": "3"},
        {"name": "A", "value": "1"},
    ]


def test_custom_resources_get_json_merge_patch_and_json6902(tmp_path, build):
    _write(
        tmp_path,
        {
            "kustomization.yaml": """\
            resources: [job.yaml]
            patches:
              - patch: |
                  apiVersion: ray.io/v1
                  kind: RayJob
                  metadata: {name: job}
                  spec:
                    rayClusterSpec:
                      headGroupSpec:
                        template:
                          spec:
                            containers:
                              - name: head
                                env: [{name: C, value: "3"}]
              - target: {group: ray.io, version: v1, kind: RayJob, name: job}
                patch: |
                  - op: replace
                    path: /spec/entrypoint
                    value: python other.py
                  - op: add
                    path: /spec/shutdownAfterJobFinishes
                    value: true
            """,
            "job.yaml": RAYJOB,
        },
    )
    (job,) = build(tmp_path)
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    # RFC 7386 for kinds kustomize has no schema for: the list is replaced, not merged.
    assert head == {"name": "head", "env": [{"name": "C", "value": "3"}]}
    assert job["spec"]["entrypoint"] == "python other.py"
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_json6902_errors_on_missing_path():
    with pytest.raises(KeyError):
        dr.json6902({"spec": {}}, [{"op": "replace", "path": "/spec/missing", "value": 1}])
    with pytest.raises(KeyError):
        dr.json6902({"spec": {}}, [{"op": "remove", "path": "/spec/missing"}])
    assert dr.json6902({"a": [1, 2]}, [{"op": "add", "path": "/a/-", "value": 3}]) == {"a": [1, 2, 3]}


def test_images_labels_and_hashed_generator_references(tmp_path, build):
    _write(
        tmp_path,
        {
            "kustomization.yaml": """\
            resources: [deploy.yaml, job.yaml]
            labels:
              - pairs: {team: ml}
                includeTemplates: true
            configMapGenerator:
              - name: settings
                literals: [X=1]
            images:
              - name: example/web
                newName: registry.local/web
                newTag: "2.0"
            """,
            "deploy.yaml": DEPLOYMENT,
            "job.yaml": RAYJOB,
        },
    )
    out = {r["kind"]: r for r in build(tmp_path)}
    dep, job, cm = out["Deployment"], out["RayJob"], out["ConfigMap"]
    assert dep["metadata"]["labels"] == {"team": "ml"}
    assert dep["spec"]["template"]["metadata"]["labels"] == {"app": "web", "team": "ml"}
    assert dep["spec"]["selector"]["matchLabels"] == {"app": "web"}  # includeSelectors: false
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/web:2.0"
    assert dep["spec"]["template"]["spec"]["containers"][1]["image"] == "example/sidecar"
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"] == "registry.local/web:2.0"  # images reach containers of custom resources
    assert cm["metadata"]["name"].startswith("settings-") and len(cm["metadata"]["name"]) == len("settings-") + 10
    web = dep["spec"]["template"]["spec"]["containers"][0]
    assert web["envFrom"][0]["configMapRef"]["name"] == cm["metadata"]["name"]
    assert "annotations" not in cm["metadata"]


def test_generator_merge(tmp_path, build):
    _write(
        tmp_path,
        {
            "base/kustomization.yaml": """\
            configMapGenerator:
              - name: env
                options: {disableNameSuffixHash: true}
                literals: [A=1, B=2]
            """,
            "over/kustomization.yaml": """\
            resources: [../base]
            configMapGenerator:
              - name: env
                behavior: merge
                options: {disableNameSuffixHash: true}
                literals: [B=20, C=3]
            """,
        },
    )
    (cm,) = build(tmp_path / "over")
    assert cm["metadata"]["name"] == "env"
    assert cm["data"] == {"A": "1", "B": "20", "C": "3"}


def test_python_renderer_refuses_fields_it_does_not_implement(tmp_path):
    _write(tmp_path, {"bad/kustomization.yaml": "resources: []\nreplicas: [{name: x, count: 2}]\n"})
    with pytest.raises(dr.UnsupportedKustomization):
        dr.build(tmp_path / "bad")


def test_cli_prints_a_yaml_stream(tmp_path, capsys):
    _write(tmp_path, {"kustomization.yaml": "resources: [deploy.yaml]\n", "deploy.yaml": DEPLOYMENT})
    assert dr.main([str(tmp_path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Deployment"]


def _cases(root: Path) -> None:
    """The features of the cases above in one kustomization, for the whole-output comparison."""
    _write(
        root,
        {
            "web/kustomization.yaml": """\
            resources: [deploy.yaml, job.yaml, cron.yaml]
            namespace: team
            labels:
              - pairs: {team: ml}
                includeTemplates: true
            commonAnnotations: {owner: ml}
            configMapGenerator:
              - name: settings
                literals: [X=1]
            secretGenerator:
              - name: creds
                literals: [token=placeholder]
            images:
              - name: example/web
                newName: registry.local/web
                newTag: "2.0"
            patches:
              - patch: |
                  apiVersion: apps/v1
                  kind: Deployment
                  metadata: {name: web}
                  spec:
                    template:
                      spec:
                        containers:
                          - name: web
                            env: [{name: B, value: "20"}, {name: C, value: "3"}]
            """,
            "web/deploy.yaml": DEPLOYMENT,
            "web/job.yaml": RAYJOB,
            "web/cron.yaml": """\
            apiVersion: batch/v1
            kind: CronJob
            metadata: {name: nightly}
            spec:
              schedule: "0 3 * * *"
              jobTemplate:
                spec:
                  template:
                    spec:
                      restartPolicy: Never
                      containers: [{name: run, image: example/web:1.0, envFrom: [{secretRef: {name: creds}}]}]
            """,
        },
    )


def test_both_renderers_agree_on_a_mixed_kustomization(tmp_path):
    """Generators with hash suffixes and the references to them, labels and annotations on pod and
    job templates, images, a strategic-merge patch, namespace, sort order: object for object."""
    _need_kubectl()
    _cases(tmp_path)
    assert dr.build(tmp_path / "web") == dr.kubectl_build(tmp_path / "web")


@pytest.mark.parametrize("overlay", [dr.DEPLOY / "base", *dr.overlay_dirs()], ids=lambda p: p.name)
def test_fallback_renders_every_overlay_exactly_as_kubectl(overlay):
    """Same objects, same order, same content: the fallback may stand in for kubectl."""
    _need_kubectl()
    assert dr.build(overlay) == dr.kubectl_build(overlay)


def test_render_prefers_kubectl_and_falls_back(monkeypatch, tmp_path):
    _write(tmp_path, {"kustomization.yaml": "resources: [deploy.yaml]\n", "deploy.yaml": DEPLOYMENT})
    monkeypatch.setenv(dr.KUSTOMIZE_ENV, "python")
    assert dr.renderer().startswith("tests/deploy_render.py") and dr.render(tmp_path) == dr.build(tmp_path)
    monkeypatch.delenv(dr.KUSTOMIZE_ENV)
    exe, _ = dr.find_kubectl()
    assert dr.renderer().startswith("kubectl" if exe else "tests/deploy_render.py")
    monkeypatch.setattr(dr, "find_kubectl", lambda: (None, "kubectl not found on PATH"))
    assert "Python fallback: kubectl not found" in dr.renderer()
    assert dr.render(tmp_path)[0]["kind"] == "Deployment"
    monkeypatch.setenv(dr.KUSTOMIZE_ENV, "kubectl")
    with pytest.raises(dr.KustomizeError, match="not found"):
        dr.render(tmp_path)


def test_kubectl_errors_carry_its_message(tmp_path):
    _need_kubectl()
    _write(tmp_path, {"kustomization.yaml": "resources: [missing.yaml]\n"})
    with pytest.raises(dr.KustomizeError, match="missing.yaml"):
        dr.kubectl_build(tmp_path)
