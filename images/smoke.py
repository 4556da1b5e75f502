"""Build the CPU flavor of the four stage images and run the demo in them, from a clean machine.

    python3 images/smoke.py            (as root where the base must come from Debian's packages)

What it does, printing each step's time:

1. finds a docker CLI with BuildKit and an engine that answers (it says how to start one);
2. finds a Python 3.11 base: CPU_BASE, else python:3.11.14-slim-bookworm (on the machine or
   pulled), else one made from Debian's packages (images/base/debian.sh);
3. builds the four images with images/build.sh FLAVOR=cpu, handing the builds this machine's pip
   setup (its CA bundle, a local wheel directory served on loopback) as BuildKit secrets, and
   prints each image's size, what the four share, and the build time;
4. makes a virtual environment of the images' own package versions (images/constraints.txt), so
   the two runs below differ in nothing but the runner;
5. runs the demo (examples/arithmetic) twice at the same run path, first with the subprocess
   runner, then with `--runner docker`, every task in its stage's container, and compares the
   two runs file by file: every data file (weights, tokenizers, optimizer states, rollouts,
   scored rollouts, eval samples, datasets) must be equal byte for byte, and each manifest must
   list the same files with the same digests; what differs (wall-clock times in manifests,
   metrics and reports) is listed. Then the same for four iterations with `model.lora`, which
   checks the images' peft (adapter checkpoints, base + adapter sampling), for two iterations
   with `train.nodes: 2` at ZeRO-3, where the train image runs two node agents (the entry every
   pod of a multi-node TrainJob runs: components.train.node, torchrun, a rendezvous over
   loopback) inside its container, and for two iterations of the tool demo
   (examples/tool_arithmetic), whose python tool runs the policy's code in the sandbox inside
   the generate and evaluate containers;
6. shows that the verify image runs code rewards in a container with no capabilities: refused,
   with the reason, under the runtime's default seccomp profile, available under the profile the
   cluster overlay ships; then runs the code demo (examples/arithmetic_code) under both runners
   and compares them as above (the host's sandbox and the container's score alike).

Exit status 0 when all of it holds. Outputs under .smoke/ (--keep keeps the runs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from smoke_build import (  # images/, beside this script
    ROOT,
    STAGES,
    build,
    find_base,
    find_docker,
    host_pip_settings,
    local_torch_wheel,
    sh,
    sizes,
    step,
)

WORK = ROOT / ".smoke"

#: Outputs that are data: equal byte for byte between the runners, or the check fails.
DATA = re.compile(
    r"\.(parquet|safetensors|jinja)$|(^|/)(tokenizer\.json|tokenizer_config\.json|"
    r"config\.json|generation_config\.json|plan\.json|state\.json|run\.yaml)$"
)
#: The runs compared across the runners (each as <name>-subprocess and <name>-docker).
RUNS = ("demo", "lora", "nodes", "tools", "vision", "code")
#: Written by the host process, not by the tasks: not compared.
HOST_ONLY = ("kfp/", "logs/", "status/")


# --- 4. the baseline environment ---------------------------------------------------------------


def baseline_venv() -> Path:
    venv = WORK / "venv"
    rlvr = venv / "bin" / "rlvr"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    if not rlvr.exists():
        sh(sys.executable, "-m", "venv", str(venv))
        sh(*pip, "--upgrade", "pip")
        # the CPU build, as in the images: PyPI's Linux torch is the CUDA one (several GB)
        cpu_index = (
            []
            if local_torch_wheel(host_pip_settings())
            else ["--index-url", "https://download.pytorch.org/whl/cpu"]
        )
        sh(*pip, *cpu_index, "torch==2.13.0")
    # every time (seconds when nothing changed): a venv kept from an earlier smoke gets the pins
    # and extras of this checkout
    sh(*pip, "-c", str(ROOT / "images/constraints.txt"), "-e", f"{ROOT}[docker,lora]")
    return rlvr


# --- 5. the two runs -------------------------------------------------------------------------


def run_demo(rlvr: Path, config: str, store: Path, run_id: str, *extra: str) -> float:
    started = time.perf_counter()
    sh(
        str(rlvr),
        "run",
        str(ROOT / config),
        "--run-id",
        run_id,
        "--set",
        f"run.store={store}",
        *extra,
    )
    return time.perf_counter() - started


def digests(run: Path) -> dict[str, str]:
    out = {}
    for p in sorted(run.rglob("*")):
        rel = p.relative_to(run).as_posix()
        if p.is_file() and not rel.startswith(HOST_ONLY):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


#: Keys of metrics and manifests that hold wall-clock measurements.
TIMING_KEY = re.compile(r"(seconds|_s$|per_s|_time|^time|_at$|duration|elapsed|wall)")


def without_timing(value):
    """A JSON value with every wall-clock key left out (recursively)."""
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if not TIMING_KEY.search(k)}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def compare(a: Path, b: Path) -> bool:
    """Every data file equal byte for byte; every JSON file (metrics, states) equal but for its
    wall-clock keys; every manifest listing the same data files with the same digests, and the
    same inputs, whose digests may differ only where that input holds wall-clock metrics."""
    da, db = digests(a), digests(b)
    ok = True
    if set(da) != set(db):
        print(f"  files only under {a.name}: {sorted(set(da) - set(db))[:10]}")
        print(f"  files only under {b.name}: {sorted(set(db) - set(da))[:10]}")
        ok = False
    counts = {"data": 0, "json": 0, "manifest": 0}
    timed_dirs: set[str] = set()  # outputs with a file that differs in wall-clock keys only
    other: dict[str, int] = {}
    common = sorted(set(da) & set(db))
    for rel in common:
        if rel.endswith("_SUCCESS"):
            continue
        same = da[rel] == db[rel]
        if DATA.search(rel):
            counts["data"] += same
            if not same:
                print(f"  DIFFERS (data): {rel}")
                ok = False
        elif rel.endswith(".json"):
            ja, jb = (json.loads((r / rel).read_text()) for r in (a, b))
            if without_timing(ja) != without_timing(jb):
                print(f"  DIFFERS (beyond wall-clock keys): {rel}")
                ok = False
            else:
                counts["json"] += 1
                if not same:
                    timed_dirs.add(rel.rsplit("/", 1)[0])
        elif not same:
            kind = re.sub(r"\d{5,}", "N", rel)
            other[kind] = other.get(kind, 0) + 1
    for rel in common:
        if not rel.endswith("_SUCCESS"):
            continue
        ma, mb = (json.loads((r / rel).read_text()) for r in (a, b))
        data_files = [[f for f in m.get("files", []) if DATA.search(f["path"])] for m in (ma, mb)]
        ia, ib = ma.get("inputs") or {}, mb.get("inputs") or {}
        inputs_ok = set(ia) == set(ib) and all(
            ia[k] == ib[k] or any(d == k or d.startswith(k + "/") for d in timed_dirs) for k in ia
        )
        if ma.get("stage") == mb.get("stage") and data_files[0] == data_files[1] and inputs_ok:
            counts["manifest"] += 1
        else:
            print(f"  DIFFERS (manifest: stage, data files, digests or inputs): {rel}")
            ok = False
    print(
        f"  {counts['data']} data files equal byte for byte; {counts['json']} metrics/state "
        f"files equal but for wall-clock keys; {counts['manifest']} manifests list the same "
        "data files, digests and inputs"
    )
    if other:
        print(
            "  differ, as expected (drawn from wall-clock times): "
            + ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(other.items()))
        )
    return ok


# --- 6. code rewards -------------------------------------------------------------------------


def sandbox_probe(docker: str, image: str, profile: str | None) -> tuple[int, str]:
    args = [
        docker,
        "run",
        "--rm",
        "--cap-drop",
        "ALL",
        "--network",
        "none",
        "--entrypoint",
        "python",
    ]
    if profile:
        args += ["--security-opt", f"seccomp={profile}"]
    out = sh(*args, image, "-m", "components.sandbox", "probe", capture=True, check=False)
    return out.returncode, (out.stdout + out.stderr).strip()


def both_runners(
    rlvr: Path, config: str, store: Path, name: str, image_sets: list[str], failures: list[str]
) -> tuple[float, float]:
    """One example under the subprocess runner, then in containers, at the same run path (each
    run moved aside after), compared file by file; returns both wall times. The image settings
    go to both runs, so both record the same config (the subprocess runner ignores them)."""
    walls = []
    for runner, extra in (("subprocess", []), ("docker", ["--runner", "docker"])):
        walls.append(run_demo(rlvr, config, store, name, *extra, *image_sets))
        (store / name).rename(store / f"{name}-{runner}")
    sub_s, dock_s = walls
    print(
        f"{name} wall time: subprocess runner {sub_s:.1f} s, docker runner {dock_s:.1f} s "
        f"(ratio {dock_s / sub_s:.2f})"
    )
    print("comparing the two runs:")
    if not compare(store / f"{name}-subprocess", store / f"{name}-docker"):
        failures.append(f"{name}: the docker runner's outputs differ from the subprocess runner's")
    return sub_s, dock_s


Leg = tuple[str, float, float]  # what a leg ran, its wall time under each runner


def all_legs(
    rlvr: Path, store: Path, image_sets: list[str], failures: list[str], only: str | None = None
) -> list[Leg]:
    """The demo, then one leg per feature whose packages or launcher live in the images
    (`only`: that leg alone, by its name in LEGS)."""

    def leg(label: str, config: str, name: str, sets: list[str]) -> Leg:
        return (label, *both_runners(rlvr, config, store, name, sets, failures))

    arith = "examples/arithmetic/config.yaml"
    plan = {
        "demo": ("demo (12 iterations)", arith, "demo", image_sets),
        # model.lora; peft at the images' pin
        "lora": ("LoRA demo (4 iterations)", arith, "lora", [*image_sets, *LORA_SETS]),
        # train.nodes=2: two node agents, ZeRO-3
        "nodes": (
            "two train nodes (2 iterations)",
            arith,
            "nodes",
            [*image_sets, *NODES_SETS, "--iterations", "2", "--set", "data.eval.0.max_prompts=50"],
        ),
        # the python tool's sandbox in the generate container
        "tools": (
            "tool demo (2 iterations)",
            "examples/tool_arithmetic/config.yaml",
            "tools",
            [*image_sets, *TOOL_SETS],
        ),
        # image prompts: Pillow and a Qwen2-VL policy in every stage's container
        "vision": (
            "image-prompt demo (4 iterations)",
            "examples/vision_count/config.yaml",
            "vision",
            [*image_sets, "--iterations", "4"],
        ),
    }
    legs = []
    for key, (label, config, name, sets) in plan.items():
        if only is None or key == only:
            print(f"{label}:")
            legs.append(leg(label, config, name, sets))
    return legs


#: What `--leg` picks from (all_legs).
LEGS = ("demo", "lora", "nodes", "tools", "vision")
LORA_SETS = [
    "--iterations",
    "4",
    "--set",
    "model.lora={rank: 8, alpha: 8}",
    "--set",
    "train.lr=5e-3",
]


def quick_legs(rlvr: Path, store: Path, image_sets: list[str], failures: list[str]) -> list[Leg]:
    """CI's one leg: the demo on two train nodes with a LoRA adapter (torchrun and peft in the
    train container, base + adapter sampling in generate's and evaluate's), 4 iterations. The
    tool demo is left out (its inputs take a 2-minute warm-up); the code sandbox it uses is
    probed in the verify image (step 6)."""
    print("the demo on two train nodes with a LoRA adapter, 4 iterations:")
    return [
        (
            "demo on two train nodes with LoRA (4 iterations)",
            *both_runners(
                rlvr,
                "examples/arithmetic/config.yaml",
                store,
                "nodes",
                [*image_sets, *NODES_SETS, *LORA_SETS],
                failures,
            ),
        )
    ]


#: two node agents of one rank each at ZeRO-3 (what the pods of a multi-node TrainJob run)
NODES_SETS = ["--set", "train.nodes=2", "--set", "train.processes=1", "--set", "train.zero_stage=3"]
TOOL_SETS = [
    "--iterations",
    "2",
    "--set",
    "data.prompts_per_iteration=32",
    "--set",
    "data.eval.0.max_prompts=50",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default=None, help="image tag (default: smoke-<git revision>)")
    ap.add_argument("--skip-build", action="store_true", help="use images built before")
    ap.add_argument("--keep", action="store_true", help="keep the runs under .smoke/runs")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="CI's smoke: one leg instead of five (the demo for 4 iterations on two train nodes "
        "with a LoRA adapter) under both runners, compared; the tool and code demos left out "
        "(the sandbox probes and tests/images/test_built_images.py cover the verify image)",
    )
    ap.add_argument(
        "--leg",
        choices=LEGS,
        default=None,
        help="run this leg of step 5 alone (the code demo of step 6 is left out)",
    )
    ap.add_argument(
        "--only",
        choices=("images", "venv"),
        default=None,
        help="make the images (steps 1-3) or the venv of their package versions "
        "(step 4), then stop: CI makes them while it installs itself",
    )
    args = ap.parse_args()
    rev = (
        sh(
            "git", "-C", str(ROOT), "rev-parse", "--short", "HEAD", capture=True, check=False
        ).stdout.strip()
        or "dev"
    )
    tag = args.tag or f"smoke-{rev}"
    WORK.mkdir(exist_ok=True)
    failures: list[str] = []

    if args.only == "venv":
        step("4. a virtual environment of the images' package versions")
        started = time.perf_counter()
        rlvr = baseline_venv()
        print(f"{rlvr.parent.parent} ready in {time.perf_counter() - started:.0f} s")
        return 0
    step("1. docker")
    docker = find_docker()
    step("2. base image")
    base = find_base(docker)
    step(f"3. build the CPU flavor on {base}")
    images = {s: f"rlvr.local/rlvr-{s}:{tag}" for s in STAGES}
    build_s = None
    if not args.skip_build:
        build_s, images = build(docker, base, tag)
        print(f"built the four images in {build_s:.0f} s")
    sizes(docker, images)
    if args.only == "images":
        return 0

    step("4. a virtual environment of the images' package versions")
    started = time.perf_counter()
    rlvr = baseline_venv()
    print(f"{rlvr.parent.parent} ready in {time.perf_counter() - started:.0f} s")

    step("5. the demo with the subprocess runner, then in containers, at the same run path")
    store = WORK / "runs"
    for name in RUNS:
        for suffix in ("", "-subprocess", "-docker"):
            shutil.rmtree(store / f"{name}{suffix}", ignore_errors=True)
    image_sets = ["--set", "cluster.image_repo=rlvr.local", "--set", f"cluster.image_tag={tag}"]
    configs = ["examples/arithmetic/config.yaml"]
    if not args.quick:
        configs += [
            "examples/tool_arithmetic/config.yaml",
            "examples/arithmetic_code/config.yaml",
            "examples/vision_count/config.yaml",
        ]
    for config in configs:
        sh(str(rlvr), "check", str(ROOT / config))  # builds the inputs now, outside the timings
    if args.quick:
        legs = quick_legs(rlvr, store, image_sets, failures)
    else:
        legs = all_legs(rlvr, store, image_sets, failures, args.leg)

    step("6. code rewards in the verify image, no capabilities")
    code, text = sandbox_probe(docker, images["verify"], None)
    print(f"runtime's default seccomp profile: exit {code}\n  " + text.replace("\n", "\n  "))
    if code == 0 or "seccomp" not in text:
        failures.append("the default profile did not give the expected clear refusal")
    with tempfile.NamedTemporaryFile("w", suffix=".json") as prof:
        prof.write(
            sh(
                str(rlvr.parent / "python"),
                "-m",
                "components.sandbox",
                "pod-profile",
                capture=True,
            ).stdout
        )
        prof.flush()
        code, text = sandbox_probe(docker, images["verify"], prof.name)
    print(
        f"the shipped profile (manifests/overlays/code-sandbox): exit {code}\n  "
        + text.replace("\n", "\n  ")
    )
    if code != 0:
        failures.append("the sandbox is not available under the shipped profile")
    code_sub_s = code_s = None
    if args.quick or args.leg:
        print("--quick / --leg: the code demo runs are left out")
    else:
        print("the code demo, with the subprocess runner, then in containers:")
        # the host's sandbox (as root: a fresh uid per run) and the container's (uid 10001: a
        # user namespace) must score alike
        code_sub_s, code_s = both_runners(
            rlvr, "examples/arithmetic_code/config.yaml", store, "code", image_sets, failures
        )

    step("summary")
    if build_s is not None:
        print(f"build {build_s:.0f} s")
    for label, sub_s, dock_s in legs:
        print(
            f"{label}: subprocess {sub_s:.1f} s, docker {dock_s:.1f} s, ratio {dock_s / sub_s:.2f}"
        )
    if code_s is not None and code_sub_s is not None:
        print(
            f"code demo: subprocess {code_sub_s:.1f} s, docker {code_s:.1f} s, ratio "
            f"{code_s / code_sub_s:.2f}"
        )
    if not args.keep:
        for name in RUNS:
            for runner in ("subprocess", "docker"):
                shutil.rmtree(store / f"{name}-{runner}", ignore_errors=True)
    for f in failures:
        print(f"FAILED: {f}")
    print("smoke: OK" if not failures else "smoke: FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
