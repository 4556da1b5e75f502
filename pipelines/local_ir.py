"""A compiled KFP pipeline's tasks, made runnable on this machine.

The local runner (pipelines/local_runner.py) runs the same pipeline a cluster runs, and reads it
the way a cluster's backend does: from the IR the KFP compiler writes (PipelineSpec, the YAML
`rlvr compile` produces), not through kfp.local's internals. For each task this module gives
what KFP's driver gives a pod:

- its **inputs**, resolved: pipeline arguments (or their compiled defaults), constants, and
  the output parameters of the tasks it depends on; `{{$.inputs.parameters[...]}}` references
  inside constants (how the compiler passes a list of task outputs) filled in;
- its **executor input** (the ExecutorInput message as JSON): the parameter values, and a path
  under the task's root for each output parameter, output artifact and the executor's output;
- its **command**, the container's command and args with the runtime placeholders filled in
  (`{{$}}`, the job's and task's names and ids, the pipeline root, outputs' paths);
- its **outputs**, read back from the executor's output file once the command exits 0.

Only the pipeline IR (schema 2.1) and the executor command line every KFP pod runs are used,
both public contracts, so the runner works across the kfp releases that write them
(pyproject.toml states the tested range). What a flat pipeline of container tasks needs is
supported; nested DAGs (sub-pipelines, dsl.ParallelFor, dsl.If) and input artifacts are refused
with a message, as rlvr's local pipelines use none of them.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

#: `{{$.inputs.parameters['name']}}` in a constant: the compiler's reference to another input.
_INPUT_REF = re.compile(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}")
#: Output paths in a container's args (container components).
_OUTPUT_PARAM = re.compile(r"\{\{\$\.outputs\.parameters\['([^']+)'\]\.output_file\}\}")
_OUTPUT_ARTIFACT = re.compile(r"\{\{\$\.outputs\.artifacts\['([^']+)'\]\.(path|uri)\}\}")
_ANY_PLACEHOLDER = re.compile(r"\{\{\$[^}]*\}\}")
#: The IR's integer parameter type: values pass through JSON as numbers and come back as floats.
_INTEGER = "NUMBER_INTEGER"
EXECUTOR_OUTPUT = "executor_output.json"


class PipelineNotRunnableLocally(ValueError):
    """The compiled pipeline uses a KFP feature the local runner does not run."""


@dataclass(frozen=True)
class Retry:
    """A task's retry policy (KFP's `set_retry`): `count` more attempts after a failure, the
    n-th (from 0) after `min(backoff_s * factor**n, max_s)` seconds."""

    count: int = 0
    backoff_s: float = 0.0
    factor: float = 2.0
    max_s: float = 3600.0

    def delay(self, attempt: int) -> float:
        return min(self.backoff_s * self.factor**attempt, self.max_s)


@dataclass(frozen=True)
class IrTask:
    """One task of the pipeline's root DAG, as compiled."""

    key: str
    """Its key in the DAG (unique; `dependentTasks` and output references use it)."""
    name: str
    """Its display name (`set_display_name`), else its key."""
    component: dict[str, Any]
    container: dict[str, Any]
    inputs: dict[str, Any]
    depends: frozenset[str]
    retry: Retry = field(default_factory=Retry)


@dataclass(frozen=True)
class CompiledPipeline:
    """The pipeline's name, root inputs and tasks, read from its compiled IR."""

    name: str
    inputs: dict[str, Any]
    tasks: dict[str, IrTask]
    path: Path

    def arguments(self, given: dict[str, Any]) -> dict[str, Any]:
        """The root inputs: `given`, else each input's compiled default."""
        unknown = sorted(set(given) - set(self.inputs))
        if unknown:
            raise PipelineNotRunnableLocally(
                f"pipeline {self.name}: no input named {', '.join(unknown)} "
                f"(its inputs: {', '.join(sorted(self.inputs)) or 'none'})"
            )
        values = {}
        for name, spec in self.inputs.items():
            if name in given:
                values[name] = given[name]
            elif "defaultValue" in spec:
                values[name] = spec["defaultValue"]
            elif not spec.get("isOptional"):
                raise PipelineNotRunnableLocally(
                    f"pipeline {self.name}: input {name} has no value and no default"
                )
        return values


def _retry(spec: dict[str, Any]) -> Retry:
    def seconds(duration: str | None, default: float) -> float:  # protobuf Duration: "30s"
        return float(duration.rstrip("s")) if duration else default

    return Retry(
        count=int(spec.get("maxRetryCount", 0)),
        backoff_s=seconds(spec.get("backoffDuration"), 0.0),
        factor=float(spec.get("backoffFactor") or 2.0),
        max_s=seconds(spec.get("backoffMaxDuration"), 3600.0),
    )


def compile_pipeline(pipeline_func: Any, path: Path) -> CompiledPipeline:
    """Compile `pipeline_func` to `path` (the IR a cluster would get) and read it back."""
    from kfp import compiler

    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline_func, package_path=str(path))
    return read_pipeline(path)


def read_pipeline(path: Path) -> CompiledPipeline:
    """The runnable tasks of a compiled pipeline (its first YAML document; a second one, the
    Kubernetes platform spec, has no effect on one machine)."""
    with open(path) as f:
        spec = next(yaml.safe_load_all(f))
    name = spec["pipelineInfo"]["name"]
    components = spec.get("components", {})
    executors = spec.get("deploymentSpec", {}).get("executors", {})
    root = spec["root"]
    tasks = {}
    for key, t in root.get("dag", {}).get("tasks", {}).items():
        component = components[t["componentRef"]["name"]]
        where = f"pipeline {name}, task {t.get('taskInfo', {}).get('name') or key}"
        if "dag" in component or "iteratorPolicy" in t or "triggerPolicy" in t:
            raise PipelineNotRunnableLocally(
                f"{where}: sub-DAGs (nested pipelines, dsl.ParallelFor, dsl.If) do not run on "
                "rlvr's local runner; run this pipeline on a cluster or on kfp.local"
            )
        executor = executors.get(component.get("executorLabel", ""), {})
        if "container" not in executor:
            raise PipelineNotRunnableLocally(
                f"{where}: only container tasks run locally (not {sorted(executor) or 'none'})"
            )
        if t.get("inputs", {}).get("artifacts"):
            raise PipelineNotRunnableLocally(
                f"{where}: input artifacts do not run on rlvr's local runner"
            )
        tasks[key] = IrTask(
            key=key,
            name=t.get("taskInfo", {}).get("name") or key,
            component=component,
            container=executor["container"],
            inputs=t.get("inputs", {}).get("parameters", {}),
            depends=frozenset(t.get("dependentTasks", [])),
            retry=_retry(t.get("retryPolicy", {})),
        )
    return CompiledPipeline(
        name=name,
        inputs=root.get("inputDefinitions", {}).get("parameters", {}),
        tasks=tasks,
        path=path,
    )


def _fill_refs(value: Any, inputs: dict[str, Any]) -> Any:
    """`value` with each `{{$.inputs.parameters['x']}}` replaced by input x: a string that is
    only the reference becomes x's value itself (a number stays a number)."""
    if isinstance(value, str):
        whole = _INPUT_REF.fullmatch(value)
        if whole and whole[1] in inputs:
            return inputs[whole[1]]
        return _INPUT_REF.sub(lambda m: _text(inputs[m[1]]) if m[1] in inputs else m[0], value)
    if isinstance(value, list):
        return [_fill_refs(v, inputs) for v in value]
    if isinstance(value, dict):
        return {k: _fill_refs(v, inputs) for k, v in value.items()}
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class RunContext:
    """What the runtime placeholders of one local pipeline run resolve to."""

    pipeline_name: str
    pipeline_root: str
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    @property
    def job_name(self) -> str:
        return f"{self.pipeline_name}-{self.job_id[:8]}"

    def task_root(self, task: IrTask) -> Path:
        """Where a task's outputs go: pipeline root / job / task key."""
        return Path(self.pipeline_root, self.job_name, task.key)

    def runtime_values(self, task: IrTask) -> dict[str, str]:
        return {
            "{{$.pipeline_job_uuid}}": self.job_id,
            "{{$.pipeline_job_name}}": self.job_name,
            "{{$.pipeline_job_resource_name}}": self.job_name,
            "{{$.pipeline_task_name}}": task.name,
            "{{$.pipeline_task_uuid}}": uuid.uuid5(uuid.UUID(self.job_id), task.key).hex,
            "{{$.pipeline_root}}": self.pipeline_root,
            "{{$.pipeline_job_create_time_utc}}": self.created,
            "{{$.pipeline_job_schedule_time_utc}}": self.created,
        }


def _fill_runtime(value: Any, runtime: dict[str, str]) -> Any:
    if isinstance(value, str) and "{{$." in value:
        for placeholder, text in runtime.items():
            value = value.replace(placeholder, text)
    elif isinstance(value, list):
        return [_fill_runtime(v, runtime) for v in value]
    elif isinstance(value, dict):
        return {k: _fill_runtime(v, runtime) for k, v in value.items()}
    return value


def task_inputs(
    task: IrTask,
    arguments: dict[str, Any],
    outputs: dict[str, dict[str, Any]],
    ctx: RunContext,
) -> dict[str, Any]:
    """The task's input parameter values: resolved, references filled in, defaults added."""
    raw: dict[str, Any] = {}
    for name, spec in task.inputs.items():
        if "componentInputParameter" in spec:
            source = spec["componentInputParameter"]
            if source in arguments:
                raw[name] = arguments[source]
        elif "runtimeValue" in spec:
            raw[name] = spec["runtimeValue"].get("constant")
        elif "taskOutputParameter" in spec:
            ref = spec["taskOutputParameter"]
            raw[name] = outputs[ref["producerTask"]][ref["outputParameterKey"]]
        else:
            raise PipelineNotRunnableLocally(
                f"pipeline {ctx.pipeline_name}, task {task.name}: input {name} comes from "
                f"{sorted(spec)}, which the local runner does not resolve"
            )
    runtime = ctx.runtime_values(task)
    values = {k: _fill_runtime(_fill_refs(v, raw), runtime) for k, v in raw.items()}
    for name, spec in task.component.get("inputDefinitions", {}).get("parameters", {}).items():
        if name not in values and "defaultValue" in spec:
            values[name] = spec["defaultValue"]
        if spec.get("parameterType") == _INTEGER and isinstance(values.get(name), float):
            values[name] = int(values[name])
    return values


def executor_input(task: IrTask, values: dict[str, Any], task_root: Path) -> dict[str, Any]:
    """The ExecutorInput message (as its JSON) that KFP's executor reads."""
    outputs = task.component.get("outputDefinitions", {})
    return {
        "inputs": {"parameterValues": values},
        "outputs": {
            "parameters": {
                name: {"outputFile": str(task_root / name)}
                for name in outputs.get("parameters", {})
            },
            "artifacts": {
                name: {
                    "artifacts": [
                        {
                            "name": name,
                            "type": spec["artifactType"],
                            "uri": str(task_root / name),
                            "metadata": {},
                        }
                    ]
                }
                for name, spec in outputs.get("artifacts", {}).items()
            },
            "outputFile": str(task_root / EXECUTOR_OUTPUT),
        },
    }


def task_command(
    task: IrTask, executor: dict[str, Any], values: dict[str, Any], ctx: RunContext
) -> list[str]:
    """The container's command and args with every placeholder filled in."""
    root = ctx.task_root(task)
    fixed = {**ctx.runtime_values(task), "{{$.outputs.output_file}}": str(root / EXECUTOR_OUTPUT)}
    where = f"pipeline {ctx.pipeline_name}, task {task.name}"
    command = []
    for part in [*task.container.get("command", []), *task.container.get("args", [])]:
        if part.lstrip().startswith(('{"Concat"', '{"IfPresent"')):
            raise PipelineNotRunnableLocally(
                f"{where}: Concat / IfPresent placeholders do not run on rlvr's local runner"
            )
        for placeholder, text in fixed.items():
            part = part.replace(placeholder, text)
        part = _INPUT_REF.sub(lambda m: _text(values[m[1]]) if m[1] in values else m[0], part)
        part = _OUTPUT_PARAM.sub(lambda m: str(root / m[1]), part)
        part = _OUTPUT_ARTIFACT.sub(lambda m: str(root / m[1]), part)
        left = _ANY_PLACEHOLDER.search(part.replace("{{$}}", ""))
        if left:
            raise PipelineNotRunnableLocally(
                f"{where}: the placeholder {left[0]} is not one the local runner fills in"
            )
        # last: the executor input's JSON may hold anything, placeholders' look-alikes too
        command.append(part.replace("{{$}}", json.dumps(executor)))
    return command


def read_outputs(task: IrTask, task_root: Path) -> dict[str, Any]:
    """The task's output parameters: from the executor's output file, else each parameter's
    own file (a container component writes those)."""
    specs = task.component.get("outputDefinitions", {}).get("parameters", {})
    written: dict[str, Any] = {}
    out_file = task_root / EXECUTOR_OUTPUT
    if out_file.exists():
        written = json.loads(out_file.read_text()).get("parameterValues", {})
    values = {}
    for name, spec in specs.items():
        if name in written:
            value = written[name]
        elif (task_root / name).exists():
            text = (task_root / name).read_text()
            value = text if spec.get("parameterType") == "STRING" else json.loads(text)
        else:
            continue
        if spec.get("parameterType") == _INTEGER and isinstance(value, float):
            value = int(value)
        values[name] = value
    return values
