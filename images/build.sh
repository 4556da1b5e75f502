#!/usr/bin/env bash
# Build, and with --push push, the four stage images under one tag:
#
#   images/build.sh REGISTRY TAG [--push]
#
# makes REGISTRY/rlvr-<stage>:TAG for generate, verify, train and evaluate: the names
# cluster.image(<stage>) derives from cluster.image_repo and cluster.image_tag
# (components/core/config_cluster.py), so the `--set` line printed last makes a run use these images.
#
# The build context is the repository root, because the Dockerfiles copy components/ and
# pipelines/; each build passes -f images/<stage>/Dockerfile, and BuildKit (Docker 23+ by
# default) applies images/<stage>/Dockerfile.dockerignore, an allow-list of what is copied.
#
# The Dockerfiles use BuildKit (secret mounts, per-Dockerfile .dockerignore): a docker CLI with
# buildx, or one with BuildKit built in (Debian's docker.io); build.sh sets DOCKER_BUILDKIT=1.
#
# Environment:
#   DOCKER       container CLI with docker's build/push/inspect flags (default: docker)
#   FLAVOR       gpu (default: the CUDA bases) or cpu: every stage on CPU_BASE, CPU torch, the
#                transformers backend in generate/evaluate
#   CPU_BASE     the FLAVOR=cpu base, a Python 3.11 image with `python3` and pip (default:
#                python:3.11.14-slim-bookworm; images/base/debian.sh makes one from Debian's
#                packages where no registry is reachable)
#   STAGES       stages to build (default: "generate verify train evaluate")
#   PLATFORM     target platform (default: linux/amd64 for gpu, where the CUDA bases are amd64
#                only; the machine's own for cpu)
#   PIP_CONF     a pip.conf for the builds' pip (a mirror, find-links, a cert path), mounted as
#                the BuildKit secret pip.conf at /etc/pip.conf and never stored in a layer.
#                FLAVOR=cpu without PIP_CONF adds PyTorch's CPU index for torch.
#   PIP_CA       a CA bundle for that pip (a proxy's own CA), the secret pip-ca: reference it
#                in PIP_CONF as `cert = /run/secrets/pip-ca`
#   NETWORK      the builds' network mode, e.g. host where the daemon has no bridge
#   KFP_VERSION  kfp installed in the images (default: the Dockerfiles' pin); must equal the kfp
#                that compiles the pipeline, else every pod pip-installs kfp at start
#   VLLM_BASE, TORCH_BASE, PYTHON_BASE
#                base image overrides, e.g. the pinned tag plus @sha256:<digest>
#   REVISION     recorded as the org.opencontainers.image.revision label (default: git HEAD)
set -euo pipefail

die() {
  echo "build.sh: $*" >&2
  exit 2
}

usage() {
  sed -n '2,4p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[[ $# -eq 2 || $# -eq 3 ]] || usage
registry=${1%/}
tag=$2
push=0
if [[ $# -eq 3 ]]; then
  [[ $3 == --push ]] || usage
  push=1
fi

# OCI repository names are lower case; tags follow the distribution spec's grammar. "latest" is
# refused: a run records the tag it used, which must keep naming the same image.
[[ -n $registry ]] || die "REGISTRY is empty"
[[ $registry == "${registry,,}" ]] || die "REGISTRY '$registry' must be lower case"
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "TAG '$tag' is not a valid image tag"
[[ $tag != latest ]] || die "refusing TAG 'latest'; use an immutable tag such as a version"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
docker=${DOCKER:-docker}
flavor=${FLAVOR:-gpu}
[[ $flavor == gpu || $flavor == cpu ]] || die "FLAVOR '$flavor' must be gpu or cpu"
if [[ $flavor == cpu ]]; then
  platform=${PLATFORM:-}
  cpu_base=${CPU_BASE:-python:3.11.14-slim-bookworm}
  VLLM_BASE=${VLLM_BASE:-$cpu_base} TORCH_BASE=${TORCH_BASE:-$cpu_base}
  PYTHON_BASE=${PYTHON_BASE:-$cpu_base}
else
  platform=${PLATFORM:-linux/amd64}
fi
export DOCKER_BUILDKIT=1
read -r -a stages <<<"${STAGES:-generate verify train evaluate}"
revision=${REVISION:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}

for stage in "${stages[@]}"; do
  [[ -f $root/images/$stage/Dockerfile ]] || die "no images/$stage/Dockerfile (STAGES=${stages[*]})"
done

# The pods only skip their start-up `pip install kfp==<compiler's version>` when the image has
# that exact kfp; warn when the kfp here (which compiles the pipeline) differs.
pinned_kfp=$(sed -n 's/^ARG KFP_VERSION=//p' "$root/images/verify/Dockerfile")
image_kfp=${KFP_VERSION:-$pinned_kfp}
local_kfp=$(python3 -c 'import importlib.metadata as m; print(m.version("kfp"))' 2>/dev/null || true)
if [[ -n $local_kfp && $local_kfp != "$image_kfp" ]]; then
  echo "build.sh: warning: kfp here is $local_kfp, the images get $image_kfp;" \
    "rebuild with KFP_VERSION=$local_kfp or compile with kfp==$image_kfp" >&2
fi

build_args=(--build-arg "KFP_VERSION=$image_kfp" --build-arg "FLAVOR=$flavor")
[[ -z $platform ]] || build_args+=(--platform "$platform")
[[ -z ${NETWORK:-} ]] || build_args+=(--network "$NETWORK")
pip_conf=${PIP_CONF:-}
if [[ -z $pip_conf && $flavor == cpu ]]; then
  pip_conf=$(mktemp)
  trap 'rm -f "$pip_conf"' EXIT
  printf '[global]\nextra-index-url = https://download.pytorch.org/whl/cpu\n' >"$pip_conf"
  if [[ -n ${PIP_CA:-} ]]; then
    printf 'cert = /run/secrets/pip-ca\n' >>"$pip_conf"
  fi
fi
if [[ -n $pip_conf ]]; then
  [[ -r $pip_conf ]] || die "PIP_CONF $pip_conf is not a readable file"
  build_args+=(--secret "id=pip.conf,src=$pip_conf")
fi
if [[ -n ${PIP_CA:-} ]]; then
  [[ -r $PIP_CA ]] || die "PIP_CA $PIP_CA is not a readable file"
  build_args+=(--secret "id=pip-ca,src=$PIP_CA")
fi
for var in VLLM_BASE TORCH_BASE PYTHON_BASE; do
  if [[ -n ${!var:-} ]]; then
    build_args+=(--build-arg "$var=${!var}")
  fi
done

images=()
for stage in "${stages[@]}"; do
  image="$registry/rlvr-$stage:$tag"
  echo "==> building $image ($flavor)" >&2
  started=$SECONDS
  "$docker" build \
    -f "$root/images/$stage/Dockerfile" \
    -t "$image" \
    --label "org.opencontainers.image.title=rlvr-$stage" \
    --label "org.opencontainers.image.version=$tag" \
    --label "org.opencontainers.image.revision=$revision" \
    --label "rlvr.flavor=$flavor" \
    "${build_args[@]}" \
    "$root"
  echo "    built $image in $((SECONDS - started)) s" >&2
  images+=("$image")
done

if ((push)); then
  for image in "${images[@]}"; do
    echo "==> pushing $image" >&2
    "$docker" push "$image"
    # After a push the image has a registry digest; printing it lets a run pin the exact bytes
    # (cluster.images.<stage>=<name>@sha256:...) instead of the tag.
    digest=$("$docker" inspect --format '{{index .RepoDigests 0}}' "$image" 2>/dev/null || true)
    if [[ -n $digest ]]; then
      echo "    $digest" >&2
    fi
  done
fi

echo "images: ${images[*]}" >&2
echo "use them in a run (rlvr run/compile/submit CONFIG ...):" >&2
# --set values are parsed as YAML, so a tag such as 1.0, 20250101 or "on" would become a number
# or a boolean and fail cluster.image_tag's string check; such tags are printed YAML-quoted
# (and shell-quoted, for pasting into a shell).
tag_arg="cluster.image_tag=$tag"
shopt -s nocasematch
if [[ $tag =~ ^[-+]?[0-9][0-9_.]*$ || $tag =~ ^0[xob][0-9a-f_]+$ ||
  $tag =~ ^(y|n|yes|no|true|false|on|off|null)$ ]]; then
  tag_arg="'cluster.image_tag=\"$tag\"'"
fi
shopt -u nocasematch
echo "--set cluster.image_repo=$registry --set $tag_arg"
