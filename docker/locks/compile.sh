#!/usr/bin/env bash
# Regenerate the images' hash locks from constraints.txt (the one place versions are chosen):
#   docker/locks/ray-image.txt        the project's dependencies with the `postgres` and `timm` extras, plus
#                                     docker/locks/ray-image.in (Ray's dashboard) (docker/Dockerfile)
#   docker/locks/ray-image-torch.txt  ray-image.txt's torch and CUDA entries (torch, triton, nvidia-*,
#                                     cuda-*), line for line: docker/Dockerfile installs them first, in
#                                     a layer of their own (only a torch or CUDA change rebuilds it)
#   docker/locks/mlflow-image.txt     docker/locks/mlflow-image.in (docker/mlflow.Dockerfile)
# Every line carries the sha256 of each file PyPI has for that version; the Dockerfiles install with
# `pip install --require-hashes --no-deps -r <lock>`, so a file that changes on the index fails the build.
# Run after any change to constraints.txt or pyproject.toml's dependencies (needs PyPI and uv:
# `pip install uv`); tests/unit/deploy/test_deploy_consistency.py fails while a lock disagrees with constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
UV=${UV:-uv}
common=(--constraint constraints.txt --python-version 3.11 --python-platform x86_64-manylinux_2_28
        --generate-hashes --no-header --quiet)
"$UV" pip compile pyproject.toml docker/locks/ray-image.in --extra postgres --extra timm "${common[@]}" \
      --output-file docker/locks/ray-image.txt
"$UV" pip compile docker/locks/mlflow-image.in "${common[@]}" --output-file docker/locks/mlflow-image.txt
# The torch/CUDA part: each entry of ray-image.txt (its `name==version \` line, the hash lines and the
# `# via` comments under it) whose name is torch, triton, nvidia-* or cuda-*.
awk '/^[A-Za-z0-9]/ { keep = ($1 ~ /^(torch|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==/) } keep' \
    docker/locks/ray-image.txt > docker/locks/ray-image-torch.txt
