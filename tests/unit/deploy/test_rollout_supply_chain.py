"""Supply chain (issue #37 item 1, the manifests): every third-party image of the rendered overlays is
`tag@sha256:<real digest>`, the digests are the ones their cited records list, deploy/release.py refuses a
tag without digest, a digest without tag and a placeholder on a third-party image, refuses to render our
placeholders for apply, and its release step (build, push, pin) is the way to an overlay that renders for
apply; the optional image-pull-secret component reaches every pod template."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy import release
from tests import deploy_render as dr

OVERLAYS = dr.overlay_dirs()
IDS = [p.name for p in OVERLAYS]
EXAMPLES = sorted(p.parent for p in (dr.DEPLOY / "examples").glob("*/kustomization.yaml"))
ZERO = "sha256:" + "0" * 64
# The pins and where each comes from (the manifests cite the same sources beside them).
PINNED = {
    # docker-library/repo-info, repos/postgres/remote/17.11-bookworm.md (Docker Official Images record)
    "postgres:17.11-bookworm": "sha256:639ab7ceb90e13123085b741fb31ef493fba25463002f6da665352e7b534b652",
    # not an Official Image: as unrelated public deployments pin it (deploy/overlays/dev/minio.yaml)
    "quay.io/minio/minio:RELEASE.2025-09-07T16-13-09Z": (
        "sha256:14cea493d9a34af32f524e538b8346cf79f3321eff8e708c1e2960462bd8936e"
    ),
}


def _need_renderer():
    try:
        release.find_kustomize()
    except release.ReleaseError as exc:
        pytest.skip(f"deploy/release.py renders with kustomize: {exc}")


@pytest.mark.parametrize("target", [*OVERLAYS, *EXAMPLES], ids=[*IDS, *(f"examples/{p.name}" for p in EXAMPLES)])
def test_every_third_party_image_is_pinned_by_a_real_digest(target):
    resources = dr.render(target)
    assert release.problems(resources) == []
    third = {i for _, i in release.images(resources) if release.ours(i) is None}
    assert third, "the overlay names no third-party image at all?"
    for image in third:
        tagged, digest = image.split("@")
        assert PINNED.get(tagged) == digest, image
    # our images: every reference by digest, the repository's placeholder until a release
    for where, image in release.images(resources):
        if release.ours(image):
            assert image.endswith("@" + ZERO), (where, image)


def test_restore_job_and_the_records_cited_beside_the_pins():
    restore = yaml.safe_load((dr.DEPLOY / "restore" / "mlflow-db-restore-job.yaml").read_text())
    assert release.problems([restore]) == []
    for path in [
        dr.DEPLOY / "base" / "mlflow" / "deployment.yaml",
        dr.DEPLOY / "overlays" / "dev" / "postgres.yaml",
        dr.DEPLOY / "overlays" / "dev" / "optuna-db-job.yaml",
        dr.DEPLOY / "restore" / "mlflow-db-restore-job.yaml",
    ]:
        text = path.read_text()
        assert "docker-library/repo-info, repos/postgres/remote/17.11-bookworm.md" in text, path
        assert PINNED["postgres:17.11-bookworm"] in text, path


@pytest.mark.parametrize(
    "image, ok",
    [
        ("postgres:17.11-bookworm@" + PINNED["postgres:17.11-bookworm"], True),
        ("postgres:17.11-bookworm", False),  # a tag alone
        ("postgres@" + PINNED["postgres:17.11-bookworm"], False),  # a digest nobody can name
        ("postgres:17.11-bookworm@" + ZERO, False),  # the placeholder on a third-party image
        ("postgres:17.11-bookworm@sha256:abc", False),  # not a digest
        ("registry.example.com/calib-sweeps/ray@" + ZERO, True),  # ours: placeholder allowed in the repository
        ("registry.example.com/calib-sweeps/ray:0.1.0", False),  # ours by tag
        ("calib-sweeps/mlflow@sha256:" + "1" * 64, True),
    ],
)
def test_the_image_rules(image, ok):
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": image}]}}
    assert (release.problems([pod]) == []) is ok, release.problems([pod])


def test_autoscaler_and_init_container_images_are_checked_too():
    job = {
        "kind": "RayJob",
        "metadata": {"name": "j"},
        "spec": {
            "rayClusterSpec": {
                "autoscalerOptions": {"image": "rayproject/ray:2.60.0-py311-cpu"},
                "headGroupSpec": {"template": {"spec": {"initContainers": [{"name": "i", "image": "busybox:1"}]}}},
            }
        },
    }
    found = release.problems([job])
    assert any("autoscaler" in p for p in found) and any("/i:" in p for p in found), found


def test_for_apply_refuses_our_placeholders_only():
    resources = dr.render(dr.DEPLOY / "overlays" / "dev")
    found = release.problems(resources, for_apply=True)
    assert found and all("placeholder digest of our image" in p for p in found)
    names = {release.ours(p.split(": ")[1]) for p in found}
    assert names == {"calib-sweeps/ray", "calib-sweeps/mlflow"}


def _cli(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(dr.DEPLOY / "release.py"), *args], capture_output=True, text=True, env=env, cwd=cwd
    )


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_render_refuses_the_repository_overlays_and_check_passes_them(overlay):
    _need_renderer()
    refused = _cli("render", str(overlay))
    assert refused.returncode == 1 and refused.stdout == ""
    assert "placeholder digest of our image" in refused.stderr
    assert _cli("check", str(overlay)).returncode == 0


def _fake_tools(bin_dir: Path, log: Path, digest_hex: str) -> None:
    """A `docker` that records its arguments and answers a push with a digest (as docker push prints it)."""
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'if [ "$1" = push ]; then\n'
        '  case "$2" in *mlflow*) d=' + digest_hex[::-1] + ";; *) d=" + digest_hex + ";; esac\n"
        '  echo "0.2.0: digest: sha256:$d size: 1234"\n'
        "fi\n"
    )
    (bin_dir / "docker").chmod(stat.S_IRWXU)
    _link_renderer(bin_dir)


def _link_renderer(bin_dir: Path) -> None:
    """The CLI run with PATH=BIN_DIR finds the pinned kustomize beside sys.executable (.venv/bin) as
    always; a kustomize or kubectl it would find on PATH instead is linked into BIN_DIR."""
    exe = release.find_kustomize()[0][0]
    if Path(exe) != Path(sys.executable).parent / "kustomize":
        (bin_dir / Path(exe).name).symlink_to(exe)


def _copy_deploy(tmp: Path) -> Path:
    root = tmp / "repo"
    shutil.copytree(dr.DEPLOY, root / "deploy", ignore=shutil.ignore_patterns("secrets.yaml", "*.pyc"))
    return root / "deploy"


def test_release_builds_pushes_pins_and_then_renders_for_apply(tmp_path):
    _need_renderer()
    deploy = _copy_deploy(tmp_path)
    overlay = deploy / "overlays" / "gpu-cluster"
    log, digest = tmp_path / "docker.log", "ab" * 32
    _fake_tools(tmp_path / "bin", log, digest)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}"}  # no kustomize: the kustomization.yaml edit
    before = _cli("render", str(overlay), env=env)
    assert before.returncode == 1
    # the egress address ranges are the user's to set: refused by name until they are
    assert "NetworkPolicy/egress-s3-clients-https: 192.0.2.0/26: placeholder address range" in before.stderr
    for f in (overlay / "patches" / "egress-addresses.yaml", overlay / "networkpolicy-egress.yaml"):
        f.write_text(dr.with_addresses(f.read_text()))
    out = _cli(
        "release", str(overlay), "--registry", "reg.example.com/team/calib-sweeps", "--version", "0.2.0", env=env
    )
    assert out.returncode == 0, out.stderr
    calls = log.read_text().splitlines()
    assert (
        calls[0].startswith("build -f ")
        and calls[0].endswith(str(dr.REPO_ROOT))
        and "-t reg.example.com/team/calib-sweeps/ray:0.2.0" in calls[0]
    )
    assert (
        calls[1] == "push reg.example.com/team/calib-sweeps/ray:0.2.0"
        and calls[3] == "push reg.example.com/team/calib-sweeps/mlflow:0.2.0"
    )
    # the kustomization now names the pushed digests (comments and the other entries untouched)
    text = (overlay / "kustomization.yaml").read_text()
    assert f"newName: reg.example.com/team/calib-sweeps/ray\n    digest: sha256:{digest}" in text
    assert f"newName: reg.example.com/team/calib-sweeps/mlflow\n    digest: sha256:{digest[::-1]}" in text
    assert text.startswith("# Production GPU cluster")
    rendered = _cli("render", str(overlay), env=env)
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    ours = {i for _, i in release.images(docs) if release.ours(i)}
    assert ours == {
        f"reg.example.com/team/calib-sweeps/ray@sha256:{digest}",
        f"reg.example.com/team/calib-sweeps/mlflow@sha256:{digest[::-1]}",
    }
    assert release.problems(docs, for_apply=True) == []


def test_release_uses_kustomize_edit_where_installed(tmp_path):
    _need_renderer()
    deploy = _copy_deploy(tmp_path)
    overlay = deploy / "overlays" / "dev"
    log, digest = tmp_path / "docker.log", "cd" * 32
    _fake_tools(tmp_path / "bin", log, digest)
    edits = tmp_path / "kustomize.log"
    (tmp_path / "bin" / "kustomize").write_text(f'#!/bin/sh\necho "$PWD $@" >> {edits}\n')
    (tmp_path / "bin" / "kustomize").chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}"}
    out = _cli("release", str(overlay), "--registry", "localhost:5001/calib-sweeps", "--version", "1", env=env)
    # the fake kustomize edited nothing, so the placeholders remain and the release refuses to finish
    assert out.returncode == 1 and "placeholder digest of our image" in out.stderr
    assert edits.read_text().split() == [
        str(overlay),
        "edit",
        "set",
        "image",
        f"calib-sweeps/ray=localhost:5001/calib-sweeps/ray@sha256:{digest}",
        f"calib-sweeps/mlflow=localhost:5001/calib-sweeps/mlflow@sha256:{digest[::-1]}",
    ]


def test_release_refuses_a_push_without_a_digest(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "docker").chmod(stat.S_IRWXU)
    deploy = _copy_deploy(tmp_path)
    before = (deploy / "overlays" / "dev" / "kustomization.yaml").read_text()
    out = _cli(
        "release",
        str(deploy / "overlays" / "dev"),
        "--registry",
        "r/calib-sweeps",
        "--version",
        "1",
        env={**os.environ, "PATH": str(bin_dir)},
    )
    assert out.returncode == 2 and "printed no digest" in out.stderr
    refused = _cli("release", str(deploy / "overlays" / "dev"), "--registry", "r/team", "--version", "1")
    assert refused.returncode == 2 and "must end with /calib-sweeps" in refused.stderr
    assert (deploy / "overlays" / "dev" / "kustomization.yaml").read_text() == before


def test_digests_rereads_every_third_party_pin(tmp_path):
    _need_renderer()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answers = {k.split("/")[-1]: v for k, v in PINNED.items()}
    script = '#!/bin/sh\ncase "$2" in\n' + "".join(f"  *{k}) echo {v};;\n" for k, v in answers.items()) + "esac\n"
    (bin_dir / "crane").write_text(script)
    (bin_dir / "crane").chmod(stat.S_IRWXU)
    _link_renderer(bin_dir)
    env = {**os.environ, "PATH": str(bin_dir)}
    ok = _cli("digests", str(dr.DEPLOY / "overlays" / "dev"), env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert sorted(re.findall(r"^(\S+): ok$", ok.stdout, re.M)) == sorted(PINNED)
    # the registry moved the tag: reported
    (bin_dir / "crane").write_text(script.replace(answers["postgres:17.11-bookworm"], "sha256:" + "e" * 64))
    moved = _cli("digests", str(dr.DEPLOY / "overlays" / "dev"), env=env)
    assert moved.returncode == 1 and "postgres:17.11-bookworm: DIFFERS" in moved.stdout


def test_image_pull_secret_component_reaches_every_pod_template():
    resources = dr.render(dr.DEPLOY / "examples" / "dev-private-registry")
    templates = [(where, spec) for r in resources for where, spec in dr.pod_specs(r)]
    assert len(templates) >= 10
    for where, spec in templates:
        assert spec.get("imagePullSecrets") == [{"name": "registry-credentials"}], where
    # and nothing else changed
    plain = dr.render(dr.DEPLOY / "overlays" / "dev")
    for r in resources:
        for _, spec in dr.pod_specs(r):
            spec.pop("imagePullSecrets")
    assert sorted(map(dr.resource_id, resources)) == sorted(map(dr.resource_id, plain))
    assert yaml.safe_dump(sorted(resources, key=dr.resource_id)) == yaml.safe_dump(sorted(plain, key=dr.resource_id))
    secret = yaml.safe_load((dr.DEPLOY / "components" / "image-pull-secret" / "secrets.example.yaml").read_text())
    assert secret["type"] == "kubernetes.io/dockerconfigjson" and secret["metadata"]["name"] == "registry-credentials"
