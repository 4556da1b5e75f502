#!/bin/bash
# The GPU check, run 1 of 2 (docs/gpu.md), on a GPU machine with the working tree and
# .gpu/whl .gpu/smolA (benchmarks/gpu/bundle.sh): installs the wheels into /tmp/site, keeps the
# GGUF's first part in /tmp for run 2, then tests/e2e/test_gpu.py and the arithmetic demo on CUDA.
# Figures go to $OUT and to /tmp/gpu-check (run 2 gathers them into one file).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}; F=/tmp/gpu-check; mkdir -p "$OUT" "$F" /tmp/stash /tmp/bin; T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .gpu/whl/*.whl >"$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
cp .gpu/smolA/part.00 /tmp/stash/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export COLUMNS=400  # the console's lines unwrapped in the logs (the run directory is read from them)
printf '#!/bin/bash\nexec python3 -c "import sys; from pipelines.cli import entry; sys.argv[0]=\\"rlvr\\"; entry()" "$@"\n' >/tmp/bin/rlvr
chmod +x /tmp/bin/rlvr; export PATH=/tmp/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$F/gpu.txt"
python3 -c "import sys,torch,transformers,deepspeed,kfp; print('python',sys.version.split()[0],'torch',torch.__version__,'transformers',transformers.__version__,'deepspeed',deepspeed.__version__,'kfp',kfp.__version__,'cuda',torch.cuda.is_available())" | tee "$F/versions.txt"
T=$(date +%s); timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra tests/e2e/test_gpu.py >"$OUT/gpu_tests.log" 2>&1
echo "tests/e2e/test_gpu.py rc=$? $(( $(date +%s) - T )) s: $(tail -1 "$OUT/gpu_tests.log")" | tee "$F/tests.txt"
# lm-eval is not in such an image: the held-out set only
EV='data.eval=[{name: heldout, path: .build/eval.parquet, n: 4, max_prompts: 200, temperature: 1.0}]'
T=$(date +%s); timeout 240 rlvr run examples/arithmetic/config.yaml --set "$EV" >"$OUT/demo.log" 2>&1
echo "demo rc=$? $(( $(date +%s) - T )) s" | tee "$F/demo-run.txt"
grep -v '^\s*$' "$OUT/demo.log" | grep -v 'it/s\]' | tail -22 | cut -c1-200
R=$(sed -n 's/.*outputs under \([^ ]*\).*/\1/p' "$OUT/demo.log" | tail -1)
python3 benchmarks/gpu/figures.py run "$R" "$F/demo.json" || true
echo "run 1: $(( $(date +%s) - T0 )) s"
