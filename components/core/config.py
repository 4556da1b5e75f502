"""Run configuration: one YAML per run, validated by pydantic.

Every stage takes the same resolved `RunConfig`. Unknown keys and bad values are errors that name
the key, the value and the expected form (`ConfigError`). `--set a.b=c` overrides are applied to
the raw mapping before validation, so they are validated exactly like the file.

Paths in `model` and `data` that are relative are resolved against the config file's directory;
`run.store` that is relative is resolved against the current directory (runs land in
`./rlvr-runs/` by default).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from components.core.config_base import ConfigError, Strict, apply_overrides, format_error
from components.core.config_cluster import ClusterSection
from components.core.config_fields import ALWAYS, NEVER, USER, setting, when
from components.core.config_stages import (  # noqa: F401 - re-exported
    EnvironmentSection,
    EvaluateSection,
    GenerateSection,
    HandoffSection,
    OverlongPenalty,
    RewardComponent,
    RewardSpec,
    TrainSection,
    VerifySection,
)


class RunSection(Strict):
    store: str = setting("./rlvr-runs", tier=USER)
    """Where runs live: a local path, file:// URI, or s3://bucket/prefix."""
    run_id: str | None = setting(None, tier=USER)
    """Run id; defaults to the config file's parent directory name."""
    iterations: int = setting(2, ge=1, tier=USER)
    """RL iterations (generate -> verify -> train). Any number: the pipeline runs them in
    segments of `segment_iterations`, so its size does not grow with them."""
    segment_iterations: int = Field(50, ge=1)
    """Iterations served by one set of warm workers (one pipeline run on a cluster; the next
    segment is submitted by the last task of this one). Bounds a worker pod's lifetime."""
    wait_timeout_s: float = Field(3600.0, gt=0)
    """How long a worker waits for an input (another stage's commit) before it gives up."""
    local_threads: int | None = Field(None, ge=1)
    """CPU threads of every worker under `rlvr run` (OMP_NUM_THREADS). None: by stage, so that
    workers computing at the same time do not oversubscribe the cores (pipelines/cli.py)."""
    poll_max_s: float | None = Field(None, gt=0)
    """Longest pause between two looks at the store while a worker waits (backoff from 20 ms).
    None: 0.01 s on a local store (a few stats per look), 1 s on S3 (a LIST request per look)."""
    seed: int = 0
    """Root seed: prompt selection and sampling derive from it."""
    s3_endpoint_url: str | None = None
    """S3 endpoint (MinIO, moto). Unset: the standard AWS environment (AWS_ENDPOINT_URL)."""

    @field_validator("run_id")
    @classmethod
    def _run_id_is_a_name(cls, v: str | None) -> str | None:
        if v is not None and (not v or "/" in v or v.startswith(".")):
            raise ValueError("must be a plain name: no '/', not empty, not starting with '.'")
        return v


class PrepareSection(Strict):
    module: str | None = None
    """Python module run as `python -m MODULE --out DIR` when an input is missing."""
    out: str | None = None
    """The directory the prepare module writes (relative to the config file)."""


class LoraSection(Strict):
    """`model.lora`: train a LoRA adapter on the frozen base instead of every weight
    (components/model/adapter.py; docs/algorithms.md, "LoRA")."""

    rank: int = setting(8, ge=1, lineage=ALWAYS)
    """The adapter's rank r (its matrices are d x r and r x d)."""
    alpha: float = setting(16.0, gt=0, lineage=ALWAYS)
    """Scale alpha / rank on the adapter's update."""
    dropout: float = setting(0.0, ge=0, lt=1, lineage=ALWAYS)
    """Dropout on the adapter's input in the gradient passes only (the no-grad passes that give
    the old and reference logprobs run without it); the base's own dropout stays off."""
    target_modules: str | list[str] = setting("all-linear", lineage=ALWAYS)
    """`all-linear` (every linear layer but the output head, MLP included, as "LoRA Without
    Regret" recommends) or a list of module names (`q_proj`, `v_proj`, ...)."""
    output_head: bool = setting(False, lineage=ALWAYS)
    """Adapt the output head (`lm_head`) too. Worth it on small models, whose head is a large
    share of what RL changes (the demo: pass@1 0.58 with it against 0.48 without); the merge
    unties a head tied to the input embeddings first, so only the head changes."""
    vision_tower: bool = setting(False, lineage=when("lora_vision_tower"))
    """Vision-language policies: adapt the vision tower's linear layers too. By default only
    the language model gets adapters (the tower stays as the base has it)."""

    @model_validator(mode="after")
    def _head_with_named_targets(self) -> LoraSection:
        if (
            self.output_head
            and isinstance(self.target_modules, str)
            and self.target_modules != "all-linear"
        ):
            raise ValueError(
                f"output_head with target_modules {self.target_modules!r}: a pattern cannot be "
                "extended by the head; give the modules as a list or use all-linear"
            )
        return self


class ModelSection(Strict):
    base: str = setting(tier=USER)
    """The base policy: an HF checkpoint directory (path or URI) or a Hugging Face Hub id
    (``Qwen/Qwen2.5-0.5B-Instruct``, ``hf://OWNER/NAME@REVISION``), copied into the run."""
    lora: LoraSection | None = setting(None, tier=USER)
    """Train a LoRA adapter instead of the full weights (null: full fine-tuning)."""


class EvalSetConfig(Strict):
    name: str = setting("heldout", lineage=ALWAYS, tier=USER)
    """The set's name: its results go to `evals/<c>/<name>/` and `eval/<name>/...` figures."""
    path: str = setting(lineage=NEVER, tier=USER)
    """Eval dataset (verl format Parquet), path or URI."""
    n: int = setting(4, ge=1, lineage=ALWAYS, tier=USER)
    """Samples per prompt."""
    max_prompts: int | None = setting(None, ge=1, lineage=ALWAYS)
    """Evaluate only the first max_prompts prompts (None: all)."""
    temperature: float = setting(1.0, ge=0.0, lineage=ALWAYS)
    """Sampling temperature of the evaluation (0: greedy)."""
    top_p: float = setting(1.0, gt=0.0, le=1.0, lineage=ALWAYS)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = setting(0, ge=0, lineage=ALWAYS)
    """Keep the k most likely tokens (0: all)."""
    max_new_tokens: int | None = setting(None, ge=1, lineage=ALWAYS)
    """None: the generate section's max_new_tokens."""
    greedy: bool = setting(False, lineage=ALWAYS)
    """Also decode one greedy response per prompt and report greedy_pass@1."""
    ks: list[int] = setting(default_factory=list, lineage=ALWAYS)
    """Extra k values for this set's pass@k / maj@k (besides powers of two and evaluate.ks)."""
    data_sources: list[str] | None = setting(None, lineage=ALWAYS)
    """Evaluate only prompts of these data sources (None: all)."""


class LmEvalSetConfig(Strict):
    """Standard benchmarks run through EleutherAI's lm-evaluation-harness on each evaluated
    checkpoint (components/evaluate/lm_eval_suite.py): lm-eval's own task definitions, model
    adapter and metrics. Written in `data.eval` beside the verl-format sets (an entry with an
    `lm_eval` key) and kept in `data.lm_eval`."""

    name: str = "lm_eval"
    """The suite's name: its results go to `evals/<c>/lm_eval.json` and `eval/lm_eval/...` figures."""
    lm_eval: list[str] = Field(min_length=1)
    """lm-eval task or group names (`arc_easy`, `mmlu`, or tasks of `include_path`)."""
    include_path: str | None = None
    """A directory of lm-eval task YAMLs (lm-eval's `--include_path`): custom tasks, or standard
    ones over local data files where the Hub is not reachable. Relative `data_files` in them are
    relative to this directory."""
    limit: int | float | None = Field(None, gt=0)
    """Examples per task: a count, or a fraction below 1 (lm-eval's `--limit`); None: all."""
    num_fewshot: int | None = Field(None, ge=0)
    """None: each task's own default."""
    batch_size: int = Field(8, ge=1)
    """Requests lm-eval's model adapter scores at once."""
    apply_chat_template: bool = False
    """Wrap each request in the tokenizer's chat template (instruct models)."""
    fewshot_as_multiturn: bool = False
    """Few-shot examples as turns of a chat (lm-eval's flag; needs apply_chat_template)."""
    system_instruction: str | None = None
    """A system message put before every request (lm-eval's flag)."""
    seed: int = 1234
    """lm-eval's seeds (Python, NumPy, torch, few-shot sampling): the same for every checkpoint."""
    every: int = Field(1, ge=1)
    """Run on every `every`-th evaluated checkpoint (`evaluate.every` apart); the base and the
    run's last checkpoint always. Standard suites cost more than the trained task's set."""

    def due(self, checkpoint: int, evaluate_every: int, last: int) -> bool:
        """Whether this suite runs on `checkpoint` (any checkpoint when `every` is 1)."""
        if self.every == 1 or checkpoint in (0, last):
            return True
        return checkpoint % (self.every * evaluate_every) == 0

    @model_validator(mode="after")
    def _checks(self) -> LmEvalSetConfig:
        if isinstance(self.limit, float) and self.limit >= 1:
            raise ValueError(f"limit {self.limit}: a fraction is below 1; a count is an integer")
        if self.fewshot_as_multiturn and not self.apply_chat_template:
            raise ValueError("fewshot_as_multiturn needs apply_chat_template: true")
        return self


def split_eval_sets(entries: list) -> tuple[list, list]:
    """`data.eval` entries as (verl-format sets, lm-eval suites): an entry with an `lm_eval`
    key is a suite."""
    verl, suites = [], []
    for e in entries:
        is_suite = isinstance(e, LmEvalSetConfig) or (isinstance(e, dict) and "lm_eval" in e)
        (suites if is_suite else verl).append(e)
    return verl, suites


class CurriculumSection(Strict):
    """`data.sampler: curriculum`: draw prompts by their estimated pass rate (docs/algorithms.md,
    "Curriculum from pass rates")."""

    group_by: str | None = setting("data_source", lineage=ALWAYS)
    """Column (or `extra_info.<field>`) whose pooled pass rate is the prior of a prompt not yet
    seen; null: a flat Beta(1, 1) prior."""
    prior_strength: float = setting(4.0, gt=0, lineage=ALWAYS)
    """Pseudo-samples the group's pass rate counts for in a prompt's Beta prior."""
    success_threshold: float = setting(0.5, lineage=ALWAYS)
    """A sample succeeds when its reward is above this (evaluate's correctness rule)."""
    explore_share: float = setting(0.25, ge=0, le=1, lineage=ALWAYS)
    """Share of each iteration's prompts drawn uniformly from prompts never sampled (while any)."""
    sharpness: float = setting(2.0, gt=0, lineage=ALWAYS)
    """Weights are E[p(1-p)] ** sharpness under the prompt's Beta posterior."""
    retire_after: int = setting(2, ge=1, lineage=ALWAYS)
    """Retire a prompt after this many consecutive draws of it in which every sample succeeded."""
    return_after: int = setting(10, ge=1, lineage=ALWAYS)
    """A retired prompt may be drawn again this many iterations after it was retired."""


class DataSection(Strict):
    train: str = setting(tier=USER)
    """Train dataset (verl format Parquet), path or URI."""
    eval: list[EvalSetConfig] = setting(default_factory=list, tier=USER)
    """Held-out sets in verl's format, scored with pass@k on every evaluated checkpoint."""
    lm_eval: list[LmEvalSetConfig] = Field(default_factory=list)
    """Standard-benchmark suites; written in `eval` as entries with an `lm_eval` key."""
    prompts_per_iteration: int = setting(64, ge=1, tier=USER)
    """Prompts drawn per iteration, walking a seeded permutation of the train set epoch by epoch."""
    sampler: Literal["uniform", "curriculum"] = "uniform"
    """`uniform`: the seeded permutation above; `curriculum`: by estimated pass rate."""
    curriculum: CurriculumSection = Field(default_factory=CurriculumSection)
    """The curriculum sampler's settings (`sampler: curriculum`)."""
    max_image_pixels: int = Field(4096 * 4096, ge=1)
    """Image prompts: the largest source image `rlvr check` accepts (width x height). The
    processor scales every image into its own pixel range anyway; a larger one only costs
    decoding time and memory in every stage that reads it."""

    @property
    def evaluates(self) -> bool:
        """Whether checkpoints are evaluated: held-out sets or standard-benchmark suites."""
        return bool(self.eval or self.lm_eval)

    @model_validator(mode="before")
    @classmethod
    def _suites_out_of_eval(cls, raw: object) -> object:
        if isinstance(raw, dict) and isinstance(raw.get("eval"), list):
            verl, suites = split_eval_sets(raw["eval"])
            if suites:
                raw = {**raw, "eval": verl, "lm_eval": [*(raw.get("lm_eval") or []), *suites]}
        return raw


class TrackingSection(Strict):
    """Where each stage logs its figures (components/core/tracking.py)."""

    backends: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["tensorboard"]
    )
    """TensorBoard event files go into the run (`<run>/tensorboard/<task>/`), no server needed."""
    mlflow_tracking_uri: str | None = None
    """Default: the MLFLOW_TRACKING_URI environment variable, else MLflow's own default."""
    mlflow_experiment: str = "rlvr"
    """The MLflow experiment runs log to."""
    wandb_project: str = "rlvr"
    """The W&B project runs log to."""
    wandb_entity: str | None = None
    """The W&B entity (user or team); default: W&B's own."""
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    """Default: W&B's own (the WANDB_MODE environment variable, else online)."""


class RetentionSection(Strict):
    """What a run keeps in the store (components/core/retention.py; docs/contracts.md,
    "Retention"). The base checkpoint, the scored rollouts (a resume replays from them), the
    evaluations and every manifest are always kept; a checkpoint or train state past this
    policy has its files deleted once every stage that reads it has committed, and its
    manifest stays, marked retired, so lineage, reports and the dashboard are unaffected."""

    enabled: bool = True
    """false: keep every checkpoint and train state."""
    keep_last: int = setting(2, ge=1, tier=USER)
    """The newest checkpoints kept (the policy generate samples next is always among them)."""
    milestone_every: int = Field(50, ge=0)
    """Also keep every checkpoint whose number is a multiple of this (0: none)."""
    keep_states: int = Field(1, ge=1)
    """The newest full train states kept (one suffices: a resume replays from the newest)."""
    lease_ttl_s: float = Field(10800.0, gt=0)
    """A reader's lease on a checkpoint (it is loading it) holds deletion off; a lease older
    than this, or of a process gone from this host, is a crashed reader's and no longer does."""


class HealthSection(Strict):
    """Run health (components/train/health.py; docs/health.md): train judges every iteration
    from the figures the stages commit, records the verdict in its checkpoint's manifest, warns
    as a symptom appears and stops the run when no group has carried a learning signal for
    `stop_after` iterations in a row. None of it changes what any stage computes."""

    stop_after: int = setting(3, ge=0, tier=USER)
    """End the run cleanly after this many iterations in a row in which (nearly) every group
    had equal rewards: GRPO-family advantages are then zero, so the update has no evidence to
    learn from (0: never stop; the verdict is still given)."""
    no_signal_share: float = Field(0.95, gt=0.0, le=1.0)
    """An iteration has no signal when at least this share of its groups has equal rewards."""
    truncation: float = Field(0.5, gt=0.0, le=1.0)
    """A truncation surge: at least this share of responses cut at max_new_tokens ..."""
    truncation_rise: float = Field(1.5, ge=1.0)
    """... and at least this many times iteration 0's share."""
    update_kl: float = Field(0.3, gt=0.0)
    """An update that moved the policy too far: train/approx_kl or train/ppo_kl above this."""
    logprob_gap: float = Field(0.05, gt=0.0)
    """Sampler and trainer disagree: train/rollout_kl (their logprobs' KL) above this."""
    reward_drop: float = Field(0.5, gt=0.0, lt=1.0)
    """The reward fell: two iterations in a row at or below this fraction of the best
    two-iteration mean so far (once that best is at least 0.1)."""


class RunConfig(Strict):
    run: RunSection = Field(default_factory=RunSection)
    """The run: its store, id, length, segments, seed and waits."""
    prepare: PrepareSection | None = None
    """A module that builds missing inputs (the examples' data and base models)."""
    model: ModelSection
    """The base policy, and LoRA."""
    data: DataSection
    """The train set, held-out sets, standard-benchmark suites and prompt sampling."""
    generate: GenerateSection = Field(default_factory=GenerateSection)
    """Sampling: backend, n, temperature, lengths, tools, shards."""
    verify: VerifySection = Field(default_factory=VerifySection)
    """Rewards by data source, timeouts, workers, shards."""
    train: TrainSection = Field(default_factory=TrainSection)
    """The policy update: DeepSpeed, the algorithm by registry name, the handoff and the train state."""
    evaluate: EvaluateSection = Field(default_factory=EvaluateSection)
    """Held-out evaluation: which checkpoints, extra ks, the bootstrap, shards."""
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    """Images, node pools, GPUs and retries per stage on a Kubernetes cluster."""
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    """Experiment trackers: TensorBoard (default), MLflow, W&B."""
    retention: RetentionSection = Field(default_factory=RetentionSection)
    """What the run keeps in its store."""
    health: HealthSection = Field(default_factory=HealthSection)
    """Run health: the verdict per iteration, and when a run with no signal left stops."""

    def _check_vllm_temperatures(self) -> None:
        """vLLM (0.24 and later) refuses a sampling temperature above 2; say so before any
        work (on every vLLM version: a config should not depend on which one a node has)."""
        if self.generate.backend != "vllm":
            return
        temperatures = {"generate.temperature": self.generate.temperature}
        temperatures |= {f"data.eval.{e.name}.temperature": e.temperature for e in self.data.eval}
        for key, t in temperatures.items():
            if t > 2.0:
                raise ValueError(
                    f"{key}: {t} is above 2, which vLLM 0.24+ refuses; use at most 2, or "
                    "generate.backend: transformers"
                )

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        names = [e.name for e in (*self.data.eval, *self.data.lm_eval)]
        if len(set(names)) != len(names):
            raise ValueError(f"data.eval names must be unique, got {names}")
        if "lm_eval" in [e.name for e in self.data.eval]:
            raise ValueError(
                "data.eval: `lm_eval` names the standard-benchmark results (eval/lm_eval/...); "
                "give the verl-format set another name"
            )
        tasks = [t for suite in self.data.lm_eval for t in suite.lm_eval]
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"data.eval: an lm-eval task is in two suites: {tasks}")
        self._check_vllm_temperatures()
        if self.train.handoff.channel == "broadcast":
            if self.train.max_staleness > 0:
                raise ValueError(
                    "train.handoff.channel: broadcast needs every generate worker waiting for "
                    "the same policy at once (on-policy); with train.max_staleness > 0 use "
                    "channel: store"
                )
            if self.model.lora is not None:
                raise ValueError(
                    "train.handoff.channel: broadcast is for whole policies; a LoRA run hands "
                    "over an adapter of megabytes, which the store path carries: use channel: "
                    "store"
                )
            if self.train.nodes > 1:
                raise ValueError(
                    "train.handoff.channel: broadcast sends from the train task's own pod; a "
                    "multi-node step (train.nodes > 1) trains in the pods of a TrainJob: use "
                    "channel: store"
                )
        if self.train.void_turn_filter and not (self.generate.tools or self.generate.environment):
            raise ValueError(
                "train.void_turn_filter drops multi-turn trajectories with a void "
                "turn; set generate.tools (or generate.environment), or turn it off"
            )
        return self

    @field_validator("train")
    @classmethod
    def _answer_pattern(cls, t: TrainSection) -> TrainSection:
        try:
            re.compile(t.answer_pattern)
        except re.error as e:
            raise ValueError(
                f"train.answer_pattern {t.answer_pattern!r} is no regular expression ({e}); fix it"
            ) from None
        return t

    @property
    def run_id(self) -> str:
        if not self.run.run_id:
            raise ConfigError(
                "run.run_id is not set; pass --run-id or set run.run_id in the config"
            )
        return self.run.run_id

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return cls.model_validate_json(text)

    def to_yaml(self) -> str:
        return yaml.safe_dump(json.loads(self.to_json()), sort_keys=False)


def code_stages(cfg: RunConfig) -> tuple[str, ...]:
    """The stages that run model-written code, whose pods carry the `rlvr.dev/runs-code` label
    (the code-sandbox overlay's seccomp profile and egress policy) and whose local containers get
    the sandbox's seccomp profile: verify and evaluate always (the code verifier), generate too
    when the policy has tools (the python tool runs its code in the same sandbox)."""
    return ("verify", "evaluate") + (("generate",) if cfg.generate.tools else ())


def _is_uri(s: str) -> bool:
    return "://" in s and not s.startswith("file://")


def _resolve(
    path: str, base: Path, *, hub: str | None = None, prepare_out: str | None = None
) -> str:
    """A local path made absolute (relative to the config file), a URI as is, and, for
    ``hub="model"`` / ``"dataset"``, a bare Hugging Face Hub id (``Qwen/Qwen2.5-0.5B``,
    ``owner/name/train.parquet``) as ``hf://...`` when no local path of that name exists."""
    if _is_uri(path):
        return path
    if path.startswith("file://"):
        path = path[len("file://") :]
    p = Path(path).expanduser()
    local = p if p.is_absolute() else (base / p).resolve()
    # a Hub id only where nothing local could be meant: no such path, not even its first
    # directory (a typo or an input a prepare step has yet to build stays a local path),
    # and not under the prepare step's output
    if (
        hub is not None
        and not local.exists()
        and not (base / p.parts[0]).exists()
        and not (prepare_out and str(local).startswith(prepare_out.rstrip("/") + "/"))
    ):
        from components.core.hub import bare_to_spec

        spec = bare_to_spec(path, dataset=hub == "dataset")
        if spec is not None:
            return spec
    return str(local)


def load_config(
    path: str | Path,
    overrides: list[str] | None = None,
    *,
    run_id: str | None = None,
    iterations: int | None = None,
) -> RunConfig:
    """Read, override, validate and resolve a run config file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    apply_overrides(raw, list(overrides or []))
    if run_id is not None or iterations is not None:
        raw["run"] = raw.get("run") or {}
    if run_id is not None:
        raw["run"]["run_id"] = run_id
    if iterations is not None:
        raw["run"]["iterations"] = iterations
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_error(e, str(path), RunConfig)) from None
    base = path.resolve().parent
    if cfg.prepare is not None and cfg.prepare.out is not None:
        cfg.prepare.out = _resolve(cfg.prepare.out, base)
    out = cfg.prepare.out if cfg.prepare is not None else None
    cfg.model.base = _resolve(cfg.model.base, base, hub="model", prepare_out=out)
    cfg.data.train = _resolve(cfg.data.train, base, hub="dataset", prepare_out=out)
    for ev in cfg.data.eval:
        ev.path = _resolve(ev.path, base, hub="dataset", prepare_out=out)
    for suite in cfg.data.lm_eval:
        if suite.include_path is not None:
            suite.include_path = _resolve(suite.include_path, base)
    cfg.run.store = _resolve(cfg.run.store, Path.cwd())
    if cfg.run.run_id is None:
        cfg.run.run_id = base.name
    return cfg


def from_pipeline(config_json: str, run_id: str = "") -> RunConfig:
    """The config a pipeline component received (its run id may be a separate parameter)."""
    cfg = RunConfig.from_json(config_json)
    if run_id:
        cfg.run.run_id = run_id
    return cfg


def effective_config(
    config_json: str,
    run_id: str = "",
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
) -> RunConfig:
    """The config a pipeline task runs with: the compiled-in config plus the run-time pipeline
    parameters (set in the KFP UI or at submit); empty parameters change nothing. `eval_sets` is a
    JSON list of eval-set objects ({name, path, n, ...} or {name, lm_eval: [tasks], ...})."""
    cfg = from_pipeline(config_json, run_id)
    try:
        if store:
            cfg.run.store = store
        if base_checkpoint:
            cfg.model.base = base_checkpoint
        if eval_sets:
            verl, suites = split_eval_sets(json.loads(eval_sets))
            cfg.data.eval = [EvalSetConfig.model_validate(e) for e in verl]
            cfg.data.lm_eval = [LmEvalSetConfig.model_validate(e) for e in suites]
        return RunConfig.model_validate_json(cfg.to_json())
    except (ValidationError, ValueError) as e:
        raise ConfigError(f"invalid pipeline parameter: {e}") from None
