"""Malformed input, table-driven: every case through the real CLI, each asserting exit
status 2, a message naming the thing that is wrong, no traceback, and a store left as it was.

The cases cover the config, the datasets, the base checkpoint, committed rollouts and scored
rollouts, and the train state. Each runs in its own copy of a small run whose iteration 0 is
trained and whose iteration 1 is generated and verified, through `rlvr check` (nothing may be
written) or the stage that reads the input (`rlvr stage ...`: nothing may be committed).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from tests.support.runs import write_config


@dataclass
class Ctx:
    root: Path
    config: Path

    @property
    def run(self) -> Path:
        return self.root / "runs" / "t"

    @property
    def assets(self) -> Path:
        return self.root / "assets"

    def cfg(self) -> dict:
        return yaml.safe_load(self.config.read_text())

    def set(self, section: str, **values) -> None:
        cfg = self.cfg()
        cfg.setdefault(section, {}).update(values)
        self.config.write_text(yaml.safe_dump(cfg))

    def table(self, name: str) -> pa.Table:
        return pq.read_table(self.assets / name)

    def write(self, name: str, table: pa.Table) -> Path:
        path = self.assets / name
        pq.write_table(table, path)
        return path

    def rows(self, name: str) -> list[dict]:
        return self.table(name).to_pylist()

    def with_rows(self, name: str, edit: Callable[[list[dict]], None], out: str) -> Path:
        t = self.table(name)
        rows = t.to_pylist()
        edit(rows)
        return self.write(out, pa.Table.from_pylist(rows, schema=t.schema))


@pytest.fixture(scope="module")
def template(tiny_assets, tmp_path_factory) -> Path:
    """A run: iteration 0 trained, iteration 1 generated and verified (built once)."""
    from components.core.config import load_config
    from components.generate.stage import run as generate
    from components.model import run_setup
    from components.train.stage import run as train
    from components.verify.stage import run as verify

    root = tmp_path_factory.mktemp("bad-input")
    shutil.copytree(tiny_assets, root / "assets")
    config = write_config(root, root / "assets", run={"iterations": 3})
    cfg = load_config(config)
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    train(cfg, 0)
    generate(cfg, 1)
    verify(cfg, 1)
    return root


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def parquet_part(d: Path) -> Path:
    return sorted(d.glob("*.parquet"))[0]


def rewrite(path: Path, edit: Callable[[pa.Table], pa.Table]) -> None:
    t = pq.read_table(path)
    pq.write_table(edit(t), path)


def drop(col: str) -> Callable[[pa.Table], pa.Table]:
    return lambda t: t.drop_columns([col])


def retype(col: str, typ: pa.DataType, value) -> Callable[[pa.Table], pa.Table]:
    def edit(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index(col)
        return t.set_column(i, col, pa.array([value] * t.num_rows, typ))

    return edit


def rewrite_column(col: str, fn: Callable[[list], list]) -> Callable[[pa.Table], pa.Table]:
    def edit(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index(col)
        return t.set_column(
            i,
            t.schema.field(col),
            pa.array(fn(t.column(col).to_pylist()), t.schema.field(col).type),
        )

    return edit


CHECK = ["check", "{config}"]
INIT = ["stage", "init", "{config}", "--run-id", "fresh"]


def row_edit(field: str, value, row: int = 3):
    def edit(rows: list[dict]) -> None:
        rows[row][field] = value

    return edit


def gt_edit(value, row: int = 2):
    def edit(rows: list[dict]) -> None:
        rows[row]["reward_model"] = {**rows[row]["reward_model"], "ground_truth": value}

    return edit


def bad_train(ctx: Ctx, edit, name="bad_train.parquet") -> None:
    ctx.set("data", train=str(ctx.with_rows("train.parquet", edit, name)))


def write_table(ctx: Ctx, table: pa.Table, key: str = "train") -> None:
    path = ctx.write("bad.parquet", table)
    ctx.set("data", **{key: str(path)})


def base_copy(ctx: Ctx) -> Path:
    dst = ctx.assets / "base2"
    shutil.copytree(ctx.assets / "base", dst)
    ctx.set("model", base=str(dst))
    return dst


def set_key(section: str, **values):
    return lambda ctx: ctx.set(section, **values)


def raw_config(text: str):
    return lambda ctx: ctx.config.write_text(text)


def rollouts(ctx: Ctx, i: int = 1) -> Path:
    return ctx.run / f"iterations/{i:05d}/rollouts"


def scored(ctx: Ctx, i: int = 0) -> Path:
    return ctx.run / f"iterations/{i:05d}/scored"


def manifest_sizes_follow(d: Path) -> None:
    """Keep a rewritten committed file consistent with its manifest (bytes), so that the error
    is about its content, not about a torn commit."""
    m = json.loads((d / "_SUCCESS").read_text())
    for f in m["files"]:
        f["bytes"] = (d / f["path"]).stat().st_size
    (d / "_SUCCESS").write_text(json.dumps(m))


def committed_edit(where: Callable[[Ctx], Path], edit: Callable[[pa.Table], pa.Table]):
    def setup(ctx: Ctx) -> None:
        d = where(ctx)
        rewrite(parquet_part(d), edit)
        manifest_sizes_follow(d)

    return setup


def state_json(ctx: Ctx) -> Path:
    return ctx.run / "train_state/00001/state.json"


def edit_state(fn):
    def setup(ctx: Ctx) -> None:
        p = state_json(ctx)
        data = json.loads(p.read_text())
        fn(data)
        p.write_text(json.dumps(data))
        manifest_sizes_follow(p.parent)

    return setup


# --- image prompts (a tiny Qwen2-VL policy and the text train set with one image a row) ---


def png(size: tuple[int, int] = (56, 56)) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def vision_base(ctx: Ctx, *, preprocessor: bool = True) -> Path:
    """A tiny untrained vision-language policy as model.base (built in a second)."""
    from examples.vision_count.model import (
        build_image_processor,
        build_model,
        build_tokenizer,
        save_checkpoint,
    )

    out = ctx.assets / "vlm"
    if not out.exists():
        tok = build_tokenizer()
        save_checkpoint(build_model(tok), tok, build_image_processor(), out)
    if not preprocessor:
        (out / "preprocessor_config.json").unlink()
    ctx.set("model", base=str(out))
    return out


IMAGES = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


def image_train(edit: Callable[[list[dict]], None] | None = None, *, vlm: bool = True, typ=IMAGES):
    """data.train with an `images` column (one image, one placeholder per row), then `edit`."""

    def setup(ctx: Ctx) -> None:
        if vlm:
            vision_base(ctx)
        t = ctx.table("train.parquet")
        rows = t.to_pylist()
        for r in rows:
            r["prompt"] = [
                {**m, "content": "<image>" + m["content"]} if k == 0 else m
                for k, m in enumerate(r["prompt"])
            ]
            r["images"] = [{"bytes": png(), "path": None}]
        if edit is not None:
            edit(rows)
        schema = t.schema.append(pa.field("images", typ))
        if any("videos" in r for r in rows):  # a verl video column beside the images
            schema = schema.append(pa.field("videos", pa.list_(pa.binary())))
        if typ != IMAGES and pa.types.is_struct(typ.value_type):  # text where bytes belong
            for r in rows:
                r["images"] = [{"bytes": "iVBORw0KGgo=", "path": None} for _ in r["images"]]
        elif typ != IMAGES:
            for r in rows:
                r["images"] = [e["bytes"] if isinstance(e, dict) else e for e in r["images"]]
                if pa.types.is_string(typ.value_type):
                    r["images"] = ["img.png" for _ in r["images"]]
        path = ctx.write("images_train.parquet", pa.Table.from_pylist(rows, schema=schema))
        ctx.set("data", train=str(path))

    return setup


def image_row(row: int, **values):
    def edit(rows: list[dict]) -> None:
        rows[row].update(values)

    return edit


TRAIN1 = ["stage", "train", "{config}", "-i", "1"]
TRAIN0 = ["stage", "train", "{config}", "-i", "0", "--force"]
VERIFY1 = ["stage", "verify", "{config}", "-i", "1", "--force"]


# (id, setup, command, what the message must contain)
CASES: list[tuple[str, Callable[[Ctx], object], list[str], str]] = [
    # --- config ---
    ("config/unknown-key", set_key("train", lrr=0.1), CHECK, "train.lrr: unknown key"),
    ("config/unknown-section", set_key("trainer", lr=0.1), CHECK, "trainer: unknown key"),
    (
        "config/misspelled-key",
        set_key("data", prompts_per_iter=8),
        CHECK,
        "data.prompts_per_iter: unknown key (value 8); did you mean prompts_per_iteration?",
    ),
    (
        "config/input-a-prepare-step-missed",
        lambda c: (
            c.set("prepare", module="tests.support.noop_prepare", out=str(c.assets)),
            c.set("data", train=str(c.assets / "trian.parquet")),
        ),
        CHECK,
        "prepare step tests.support.noop_prepare ran, but data.train (",
    ),
    ("config/wrong-type", set_key("train", lr="fast"), CHECK, "train.lr: got 'fast'"),
    ("config/out-of-range", set_key("generate", n=0), CHECK, "generate.n"),
    ("config/not-yaml", raw_config("run: [unclosed\n"), CHECK, "is not valid YAML"),
    ("config/not-a-mapping", raw_config("- a\n- b\n"), CHECK, "must hold a mapping"),
    ("config/bad-run-id", set_key("run", run_id="a/b"), CHECK, "run.run_id"),
    ("config/decimal-image-tag", set_key("cluster", image_tag=1.1), CHECK, "quote it"),
    (
        "config/unknown-stage-placement",
        set_key("cluster", stages={"trian": {}}),
        CHECK,
        "unknown stage(s) ['trian']",
    ),
    (
        "config/accelerator-without-count",
        set_key("cluster", stages={"verify": {"accelerator_type": "nvidia.com/gpu"}}),
        CHECK,
        "accelerator_type and accelerator_count",
    ),
    (
        "config/unknown-advantage",
        set_key("train", advantage="grpoo"),
        CHECK,
        "train.advantage: unknown advantage estimator 'grpoo'",
    ),
    (
        "config/unknown-policy-loss",
        set_key("train", policy_loss="ppo"),
        CHECK,
        "train.policy_loss: unknown policy loss 'ppo'",
    ),
    (
        "config/unknown-loss-agg",
        set_key("train", loss_agg="mean"),
        CHECK,
        "train.loss_agg: unknown loss aggregation mode 'mean'",
    ),
    (
        "config/unknown-kl-estimator",
        set_key("train", kl_coef=0.1, kl_estimator="k9"),
        CHECK,
        "train.kl_estimator: unknown KL estimator 'k9'",
    ),
    (
        "config/advantage-option",
        set_key("train", advantage_options={"gamma": 0.9}),
        CHECK,
        "train.advantage_options.gamma: is not an option of advantage estimator 'grpo'",
    ),
    (
        "config/policy-loss-option",
        set_key("train", policy_loss_options={"clip_lo": 0.1}),
        CHECK,
        "train.policy_loss_options.clip_lo: is not an option of policy loss 'ppo_clip'",
    ),
    (
        "config/policy-loss-value",
        set_key("train", policy_loss_options={"clip_low": -1}),
        CHECK,
        "clip_low must be >= 0",
    ),
    (
        "config/duplicate-eval-names",
        lambda c: c.set("data", eval=[*c.cfg()["data"]["eval"], *c.cfg()["data"]["eval"]]),
        CHECK,
        "data.eval names must be unique",
    ),
    (
        "config/lora-targets-no-layer",
        set_key("model", lora={"target_modules": ["qq_proj"]}),
        CHECK,
        "model.lora.target_modules: does not fit the base",
    ),
    (
        "config/lora-rank-past-vllm",
        lambda c: (
            set_key("model", lora={"rank": 1024})(c),
            set_key("generate", backend="vllm")(c),
        ),
        CHECK,
        "model.lora.rank: 1024 is past the largest rank vLLM serves (512)",
    ),
    (
        "config/lora-head-with-pattern",
        set_key("model", lora={"target_modules": "q_proj", "output_head": True}),
        CHECK,
        "a pattern cannot be extended by the head",
    ),
    (
        "config/checkpointing-with-dropout",
        lambda c: (
            set_key("train", gradient_checkpointing=True)(c),
            (
                lambda d: (d / "config.json").write_text(
                    json.dumps(
                        {**json.loads((d / "config.json").read_text()), "attention_dropout": 0.1}
                    )
                )
            )(base_copy(c)),
        ),
        CHECK,
        "train.gradient_checkpointing: the base's config sets attention_dropout=0.1",
    ),
    (
        "config/train-node-ranks-past-its-gpus",
        lambda c: (
            set_key("train", nodes=2, processes=16)(c),
            set_key("cluster", stages={"train": {"accelerator_count": 8}})(c),
        ),
        CHECK,
        "config train.processes: 16 ranks per node, but a train node has 8 GPUs",
    ),
    (
        "config/unknown-train-job-api",
        set_key("cluster", train_job={"api": "mpi-operator"}),
        CHECK,
        "cluster.train_job.api",
    ),
    ("config/k-above-n", set_key("evaluate", ks=[64]), CHECK, "evaluate.ks"),
    (
        "config/eval-filter-matches-nothing",
        lambda c: c.set("data", eval=[{**c.cfg()["data"]["eval"][0], "data_sources": ["nope"]}]),
        CHECK,
        "data_sources",
    ),
    (
        "config/unknown-verifier",
        set_key("verify", rewards={"arithmetic": "mathh"}),
        CHECK,
        "verify.rewards.arithmetic",
    ),
    (
        "config/plugin-file-missing",
        set_key("verify", rewards={"arithmetic": "nope.py:f"}),
        CHECK,
        "nope.py",
    ),
    (
        "config/plugin-module-missing",
        set_key("verify", rewards={"arithmetic": "no_such_mod:f"}),
        CHECK,
        "no_such_mod",
    ),
    (
        "config/plugin-raises",
        lambda c: (
            (c.root / "p.py").write_text("def f(*a):\n    raise KeyError('boom')\n"),
            c.set("verify", rewards={"arithmetic": f"{c.root / 'p.py'}:f"}),
        ),
        CHECK,
        "failed on a sample of data_source 'arithmetic'",
    ),
    (
        "config/plugin-returns-nonsense",
        lambda c: (
            (c.root / "p.py").write_text("def f(*a):\n    return 'yes'\n"),
            c.set("verify", rewards={"arithmetic": f"{c.root / 'p.py'}:f"}),
        ),
        CHECK,
        "failed on a sample",
    ),
    (
        "config/data-source-without-verifier",
        set_key("verify", rewards={"other": "math"}),
        CHECK,
        "data_source ['arithmetic']",
    ),
    (
        "config/stop-token-out-of-vocab",
        set_key("generate", stop_token_ids=[10**6]),
        CHECK,
        "generate.stop_token_ids",
    ),
    (
        "config/exceeds-context",
        set_key("generate", max_new_tokens=500),
        CHECK,
        "exceeds the model's context",
    ),
    (
        "config/duplicate-reward-components",
        set_key(
            "verify",
            rewards={"arithmetic": {"components": [{"verifier": "math"}, {"verifier": "math"}]}},
        ),
        CHECK,
        "reward component names must be unique",
    ),
    (
        "config/overlong-buffer",
        set_key("verify", overlong_penalty={"max_length": 6, "buffer": 0}),
        CHECK,
        "verify.overlong_penalty.buffer",
    ),
    # --- datasets ---
    (
        "data/train-missing",
        set_key("data", train="/nonexistent/train.parquet"),
        CHECK,
        "/nonexistent/train.parquet",
    ),
    (
        "data/not-parquet",
        lambda c: (
            (c.assets / "t.parquet").write_text("hello"),
            c.set("data", train=str(c.assets / "t.parquet")),
        ),
        CHECK,
        "not a readable Parquet file",
    ),
    (
        "data/empty",
        lambda c: write_table(c, c.table("train.parquet").slice(0, 0)),
        CHECK,
        "the dataset has no rows",
    ),
    (
        "data/no-data-source",
        lambda c: write_table(c, c.table("train.parquet").drop_columns(["data_source"])),
        CHECK,
        "missing column 'data_source'",
    ),
    (
        "data/no-prompt",
        lambda c: write_table(c, c.table("train.parquet").drop_columns(["prompt"])),
        CHECK,
        "missing column 'prompt'",
    ),
    (
        "data/prompt-int",
        lambda c: write_table(c, retype("prompt", pa.int64(), 3)(c.table("train.parquet"))),
        CHECK,
        "column 'prompt' has type int64",
    ),
    (
        "data/reward-model-string",
        lambda c: write_table(
            c, retype("reward_model", pa.string(), "4")(c.table("train.parquet"))
        ),
        CHECK,
        "'reward_model' must be a struct",
    ),
    (
        "data/reward-model-without-ground-truth",
        lambda c: write_table(
            c,
            c.table("train.parquet").set_column(
                c.table("train.parquet").schema.get_field_index("reward_model"),
                "reward_model",
                pa.array([{"style": "rule"}] * c.table("train.parquet").num_rows),
            ),
        ),
        CHECK,
        "ground_truth",
    ),
    (
        "data/null-prompt",
        lambda c: bad_train(c, row_edit("prompt", None)),
        CHECK,
        "row 3: prompt has no messages",
    ),
    (
        "data/empty-prompt",
        lambda c: bad_train(c, row_edit("prompt", [])),
        CHECK,
        "row 3: prompt has no messages",
    ),
    (
        "data/null-content",
        lambda c: bad_train(c, row_edit("prompt", [{"role": "user", "content": None}])),
        CHECK,
        "row 3: a prompt message has no role or no content",
    ),
    (
        "data/empty-content",
        lambda c: bad_train(c, row_edit("prompt", [{"role": "user", "content": ""}])),
        CHECK,
        "a prompt message has no role or no content",
    ),
    (
        "data/null-ground-truth",
        lambda c: bad_train(c, gt_edit(None)),
        CHECK,
        "row 2: reward_model.ground_truth is missing or empty",
    ),
    (
        "data/empty-ground-truth",
        lambda c: bad_train(c, gt_edit("  ")),
        CHECK,
        "reward_model.ground_truth is missing or empty",
    ),
    (
        "data/null-data-source",
        lambda c: bad_train(c, row_edit("data_source", None)),
        CHECK,
        "row 3: data_source is null or empty",
    ),
    (
        "data/eval-missing",
        lambda c: c.set(
            "data", eval=[{**c.cfg()["data"]["eval"][0], "path": "/nonexistent/e.parquet"}]
        ),
        CHECK,
        "/nonexistent/e.parquet",
    ),
    (
        "data/eval-null-prompt",
        lambda c: c.set(
            "data",
            eval=[
                {
                    **c.cfg()["data"]["eval"][0],
                    "path": str(
                        c.with_rows("eval.parquet", row_edit("prompt", None, 1), "bad_eval.parquet")
                    ),
                }
            ],
        ),
        CHECK,
        "bad_eval.parquet row 1: prompt has no messages",
    ),
    (
        "data/init-validates-first",
        lambda c: bad_train(c, row_edit("prompt", None)),
        INIT,
        "row 3: prompt has no messages",
    ),
    # --- the base checkpoint ---
    (
        "ckpt/missing",
        set_key("model", base="/nonexistent/model"),
        CHECK,
        "/nonexistent/model): does not exist",
    ),
    ("ckpt/no-config", lambda c: (base_copy(c) / "config.json").unlink(), CHECK, "no config.json"),
    (
        "ckpt/invalid-config",
        lambda c: (base_copy(c) / "config.json").write_text("{nope"),
        CHECK,
        "config.json: is not a valid model config",
    ),
    (
        "ckpt/config-without-model-type",
        lambda c: (base_copy(c) / "config.json").write_text(json.dumps({"hidden_size": 4})),
        CHECK,
        "no 'model_type'",
    ),
    (
        "ckpt/pickle-only",
        lambda c: (lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"))(
            base_copy(c)
        ),
        CHECK,
        "found pickle weights",
    ),
    (
        "ckpt/truncated-weights",
        lambda c: (lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]))(
            base_copy(c) / "model.safetensors"
        ),
        CHECK,
        "model.safetensors: is truncated",
    ),
    (
        "ckpt/garbage-weights",
        lambda c: (base_copy(c) / "model.safetensors").write_bytes(b"x" * 99),
        CHECK,
        "no valid safetensors header",
    ),
    (
        "ckpt/no-tokenizer",
        lambda c: [p.unlink() for p in base_copy(c).glob("tokenizer*")],
        CHECK,
        "no tokenizer files",
    ),
    (
        "ckpt/no-pad-token",
        lambda c: (
            lambda d: (d / "tokenizer_config.json").write_text(
                json.dumps(
                    {
                        k: v
                        for k, v in json.loads((d / "tokenizer_config.json").read_text()).items()
                        if k != "pad_token"
                    }
                )
            )
        )(base_copy(c)),
        CHECK,
        "the pad token ('<|endoftext|>', id 100) is outside the model's vocabulary of 100",
    ),
    (
        "ckpt/init-validates-first",
        lambda c: (base_copy(c) / "config.json").write_text("{nope"),
        INIT,
        "is not a valid model config",
    ),
    # --- committed rollouts (read by verify) ---
    (
        "rollouts/not-parquet",
        lambda c: (
            parquet_part(rollouts(c)).write_bytes(b"not parquet at all"),
            manifest_sizes_follow(rollouts(c)),
        ),
        VERIFY1,
        "not a readable Parquet file",
    ),
    (
        "rollouts/missing-column",
        committed_edit(rollouts, drop("response_logprobs")),
        VERIFY1,
        "missing column 'response_logprobs'",
    ),
    (
        "rollouts/wrong-type",
        committed_edit(rollouts, retype("sample_index", pa.string(), "0")),
        VERIFY1,
        "column 'sample_index' has type string",
    ),
    (
        "rollouts/not-committed",
        lambda c: (rollouts(c) / "_SUCCESS").unlink(),
        VERIFY1,
        "is not committed",
    ),
    (
        "rollouts/newer-schema",
        committed_edit(
            rollouts,
            lambda t: t.replace_schema_metadata(
                {**(t.schema.metadata or {}), b"rlvr.schema_version": b"99"}
            ),
        ),
        VERIFY1,
        "schema version 99 is newer",
    ),
    (
        "rollouts/missing-policy-version",
        committed_edit(rollouts, drop("policy_version")),
        VERIFY1,
        "missing column 'policy_version'",
    ),
    # --- committed scored rollouts (read by train) ---
    (
        "scored/missing-reward",
        committed_edit(scored, drop("reward")),
        TRAIN0,
        "missing column 'reward'",
    ),
    (
        "scored/nan-reward",
        committed_edit(scored, rewrite_column("reward", lambda v: [math.nan] + v[1:])),
        TRAIN0,
        "non-finite values",
    ),
    (
        "scored/misaligned-logprobs",
        committed_edit(scored, rewrite_column("response_logprobs", lambda v: [x[:-1] for x in v])),
        TRAIN0,
        "they must align one per token",
    ),
    (
        "scored/too-stale",
        committed_edit(
            lambda c: scored(c, 1), rewrite_column("policy_version", lambda v: [-5] * len(v))
        ),
        TRAIN1,
        "train.max_staleness=0",
    ),
    (
        "scored/empty",
        committed_edit(scored, lambda t: t.slice(0, 0)),
        TRAIN0,
        "holds no scored rollouts",
    ),
    # --- the train state (read by train of iteration 1) ---
    (
        "state/corrupt-json",
        lambda c: (
            state_json(c).write_text("{not json"),
            manifest_sizes_follow(state_json(c).parent),
        ),
        TRAIN1,
        "state.json",
    ),
    ("state/wrong-step", edit_state(lambda d: d.update(step=7)), TRAIN1, "is at step 7, expected"),
    (
        "state/another-architecture",
        edit_state(lambda d: d.update(fingerprint="0" * 16)),
        TRAIN1,
        "fingerprint",
    ),
    (
        "state/truncated-moments",
        lambda c: (
            lambda f: (f.write_bytes(f.read_bytes()[:100]), manifest_sizes_follow(f.parent))
        )(c.run / "train_state/00001/state-00000-of-00001.safetensors"),
        TRAIN1,
        "state-00000-of-00001.safetensors",
    ),
    # --- image prompts (rlvr check) ---
    (
        "images/undecodable",
        image_train(image_row(4, images=[{"bytes": b"GIF89a-not-really", "path": None}])),
        CHECK,
        "row 4 column 'images': 1 image(s) does not decode",
    ),
    (
        "images/placeholder-count",
        image_train(image_row(2, images=[{"bytes": png(), "path": None}] * 2)),
        CHECK,
        "row 2: 1 placeholders, 2 images",
    ),
    (
        "images/oversized",
        lambda c: (
            image_train(image_row(5, images=[{"bytes": png((300, 200)), "path": None}]))(c),
            c.set("data", max_image_pixels=50000),
        ),
        CHECK,
        "row 5 image 0: 300x200 = 60000 pixels, over 50000",
    ),
    (
        "images/too-many",
        lambda c: (
            image_train(
                image_row(
                    1,
                    images=[{"bytes": png(), "path": None}] * 2,
                    prompt=[{"role": "user", "content": "<image><image>How much is 1+1?"}],
                )
            )(c),
            c.set("generate", max_images_per_prompt=1),
        ),
        CHECK,
        "row 1: more than generate.max_images_per_prompt=1 images in a prompt",
    ),
    (
        "images/path-without-bytes",
        image_train(image_row(0, images=[{"bytes": None, "path": "/data/img/0.png"}])),
        CHECK,
        "an image has no bytes",
    ),
    (
        "images/column-type",
        image_train(typ=pa.list_(pa.string())),
        CHECK,
        "column 'images': has type list<element: string>; store the images as a list",
    ),
    (
        "images/text-only-policy",
        image_train(vlm=False),
        CHECK,
        "hold image prompts, but the policy is a text-only model (qwen2)",
    ),
    (
        "images/bytes-as-text",
        image_train(
            typ=pa.list_(pa.struct([("bytes", pa.string()), ("path", pa.string())])),
        ),
        CHECK,
        "column 'images': has type list<element: struct<bytes: string, path: string>>",
    ),
    (
        "images/over-the-context",
        lambda c: (image_train()(c), c.set("generate", max_new_tokens=120)),
        CHECK,
        "plus 120 new tokens exceeds the model's context of 128 positions",
    ),
    (
        "images/with-tools",
        lambda c: (image_train()(c), c.set("generate", tools=["python"], max_turns=2)),
        CHECK,
        "image prompts are sampled single-turn only",
    ),
    (
        "images/videos",
        image_train(image_row(0, videos=[b"frames"])),
        CHECK,
        "column 'videos': video prompts are not supported",
    ),
    (
        "images/no-image-processor",
        lambda c: (vision_base(c, preprocessor=False), image_train()(c)),
        CHECK,
        "without preprocessor_config.json",
    ),
]


def test_the_table_is_long_enough():
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_input_fails_clearly_and_changes_nothing(case, template, tmp_path, monkeypatch):
    name, setup, command, expect = case
    root = tmp_path / "w"
    shutil.copytree(template, root)
    config = root / "config.yaml"
    cfg = yaml.safe_load(config.read_text())
    # Paths in the copied config point at the copy.
    text = config.read_text().replace(str(template), str(root))
    config.write_text(text)
    del cfg
    ctx = Ctx(root, config)
    monkeypatch.chdir(root)
    setup(ctx)
    before = snapshot(root / "runs")
    from pipelines.cli import main

    args = [a.format(config=config) for a in command]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    err = result.stderr
    assert result.exit_code == 2, f"{name}: exit {result.exit_code}\n{err[-2000:]}"
    assert "Traceback" not in err, err
    assert expect in err, f"{name}: {expect!r} not in\n{err[-2000:]}"
    after = snapshot(root / "runs")
    added = {k for k in after if k not in before and not k.startswith("t/status/")}
    changed = {k for k in before if k in after and after[k] != before[k]}
    assert not added and not changed, f"{name}: the store changed: {sorted(added | changed)[:5]}"
    table = os.environ.get("RLVR_BAD_INPUT_TABLE")
    if table:  # docs/errors.md is made from these lines, in order: one process (-n 0)
        assert "PYTEST_XDIST_WORKER" not in os.environ, "RLVR_BAD_INPUT_TABLE needs -n 0"
        message = " ".join(line.strip() for line in err.strip().splitlines() if line.strip())
        message = message.replace(str(root), "…").replace("|", "\\|")
        with open(table, "a") as f:
            f.write(f"| {name} | `rlvr {' '.join(command[:2])}` | {message[:400]} |\n")
