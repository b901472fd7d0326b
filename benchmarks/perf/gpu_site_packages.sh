#!/usr/bin/env bash
# The Python packages a lent device machine lacks, as one compressed site-packages that travels with the tree (issue #49).
#
#   bash benchmarks/perf/gpu_site_packages.sh            # writes .devcarry/site312.tar.xz (~35 MB; ~4 min here)
#
# The device image has Python 3.12 with torch, torchvision, timm, torchmetrics, numpy, pandas, pytest ... but not
# ray, optuna, mlflow, pydantic or mnist1d, and it reaches no package index. A call may carry 64 MiB with the
# tree (~20 MB), and ray's wheel alone is 79 MB: so the wheels are installed here for cp312, the parts no sweep
# imports are dropped (ray's Java jar, dashboard web client, rllib, llm; MLflow's web UI; tests), and the rest is
# packed with xz. Versions come from constraints.txt. Then, with the device tool:
#   carry [".devcarry"], command:
#   tar -C /tmp -xJf .devcarry/site312.tar.xz && export PYTHONPATH=$PWD:/tmp/site312 PYTHONUNBUFFERED=1 \
#     CALIB_DATA_CACHE=/tmp/cache && timeout 520 python3 -m benchmarks.perf.gpu_acceptance --out $OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.devcarry/' "$(git rev-parse --git-path info/exclude)" 2>/dev/null \
  || { mkdir -p "$(dirname "$(git rev-parse --git-path info/exclude)")"; echo '/.devcarry/' >>"$(git rev-parse --git-path info/exclude)"; }
pin() { grep -i "^$1==" constraints.txt | head -1 || true; }
# what the service imports that the image lacks; their own needs that the image also lacks follow
wanted=("ray[tune]==2.60.0" "$(pin optuna)" "$(pin mlflow)" "$(pin mlflow-skinny)" "$(pin pydantic)" "$(pin mnist1d)")
image_has='^(torch|torchvision|torchaudio|triton|nvidia-.*|numpy|pandas|scipy|scikit-learn|matplotlib|pyarrow|pyyaml|requests|jinja2|markupsafe|click|packaging|protobuf|filelock|fsspec|numba|llvmlite|psutil|aiohttp|grpcio|msgpack|pillow|timm|torchmetrics|werkzeug|cloudpickle|setuptools|six|sympy|networkx|typing.extensions|urllib3|certifi|idna|charset.normalizer|python.dateutil|attrs|anyio|h11|tqdm|joblib|threadpoolctl|kiwisolver|cycler|fonttools|contourpy|pyparsing|frozenlist|multidict|yarl|aiosignal|aiohappyeyeballs|propcache|markdown|absl.py|mpmath|zipp|tensorboard.*|narwhals|cuda-.*|annotated.doc|opt.einsum|gpytorch|linear.operator)$'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q "${plat[@]}" -d "$tmp/wheels" "${wanted[@]}"
keep=()
for w in "$tmp"/wheels/*.whl; do
  name=$(basename "$w" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')
  [[ $name =~ $image_has ]] || keep+=("$w")
done
python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$tmp/site312" "${keep[@]}"
cd "$tmp/site312"
rm -rf ray/jars ray/dashboard/client ray/rllib ray/llm mlflow/server/js
find . -name tests -type d -prune -exec rm -rf {} +
find . -name '*.pyi' -delete
cd - >/dev/null
mkdir -p .devcarry
tar -C "$tmp" -cf - site312 | xz -9 -T0 >.devcarry/site312.tar.xz.part
mv .devcarry/site312.tar.xz.part .devcarry/site312.tar.xz
echo "wrote .devcarry/site312.tar.xz ($(du -h .devcarry/site312.tar.xz | cut -f1)) with ${#keep[@]} packages"
