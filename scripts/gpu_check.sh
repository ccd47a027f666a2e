#!/usr/bin/env bash
# The GPU check: on a CUDA machine, in under 8 minutes, does every paper's cell train on the GPU, give the same bits
# twice, and how fast against the GPU's peak?
#
#   bash scripts/gpu_check.sh --prepare     # here, with PyPI: .gpu/ gets the wheels and data packages a CUDA image
#                                           # (torch, transformers, pandas, scikit-learn... already there) lacks
#   bash scripts/gpu_check.sh [OUT]         # there (carry .gpu): install them, run the device tests, run the data
#                                           # stages of the embedded default without DVC, then bench/bench_gpu.py
#
# The cells are the embedded default's data at the papers' model shapes: a BERT-base-shaped encoder (12 layers, 768
# wide; random weights, since no hub can be reached there) at FedMatch's length 256 and batch 32, FedCMC's length 128
# and batch 8, on train.device cuda and precision auto (bf16 on Ampere and later). Results go to OUT (default $OUT,
# else reports/gpu): gpu_check.json and the log. Extra arguments after OUT go to bench/bench_gpu.py (e.g. --set
# train.device=cpu to try the script on a machine without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 bm25s==0.3.16
        pytrec-eval-terrier==0.5.11 opacus==1.6.0)
DATA_PACKAGES=(insuranceqa_data)   # pure data packages, copied from this venv (the embedded FedMatch collections)
STAGES=(check acquire prepare fedmatch_partition fedmatch_mine fedmatch_tokenizer fedcmc_partition ssvfnas_partition)

if [[ "${1:-}" == "--prepare" ]]; then
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  rm -rf .gpu && mkdir -p .gpu/wheels .gpu/site
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/wheels "${WHEELS[@]}"
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for package in "${DATA_PACKAGES[@]}"; do cp -r "$site/$package" .gpu/site/; done
  du -sh .gpu
  echo "carry .gpu to the GPU machine and run: bash scripts/gpu_check.sh"
  exit 0
fi

out="${1:-${OUT:-reports/gpu}}"
shift || true
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee "$out/gpu_check.log") 2>&1
python=python3
if [[ -d .gpu ]]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fedrepro-site .gpu/wheels/*.whl
  cp -r .gpu/site/* /tmp/fedrepro-site/
  export PYTHONPATH="/tmp/fedrepro-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 FEDREPRO_CELL_STORE=off
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "no nvidia-smi: no GPU here"
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "GPUs", torch.cuda.device_count())'

echo "== device tests"
"$python" -m pytest -q -p no:cacheprovider -n 0 tests/test_device.py

echo "== data stages of the embedded default, without DVC"
for stage in "${STAGES[@]}"; do
  command=$("$python" -c 'import sys, yaml; print(yaml.safe_load(open("dvc.yaml"))["stages"][sys.argv[1]]["cmd"])' "$stage")
  echo "-- $stage: $command"
  start=$SECONDS
  ${command/python/$python}
  echo "   $((SECONDS - start)) s"
done

echo "== one cell of each paper, twice, at the papers' model shapes"
"$python" bench/bench_gpu.py --out "$out" --rounds 2 \
  --set model.tiny.layers=12 --set model.tiny.hidden=768 --set model.tiny.heads=12 --set model.tiny.intermediate=3072 \
  --set model.max_length=256 --set train.batch_size=32 --set train.precision=auto --set train.device=auto \
  --set fedcmc.settings.max_length=128 --set fedcmc.settings.batch_size=8 "$@"
