"""The vLLM API the backend uses, checked against vLLM's own source without vLLM installed (it
is CUDA-only): every name components/model/vllm_backend.py and vllm_worker.py use must exist,
and every keyword they pass must be accepted, in the lowest supported release (pyproject's
`vllm` extra), the images' (images/*/Dockerfile) and the newest. The source comes from the
released wheels, a few members each over HTTP Range requests, cached under
~/.cache/rlvr-vllm-source (tests/support/vllm_api/); with neither the cache nor the
network, these tests skip."""

from __future__ import annotations

import functools
import re
import shutil
import tomllib

import pytest

from tests.support import vllm_api as vs

#: The newest vLLM release on PyPI when this was written (`pip index versions vllm`): raise it
#: when the backend is checked against a newer one.
NEWEST = "0.33.0"


def _lowest() -> str:
    pyproject = tomllib.loads((vs.REPO / "pyproject.toml").read_text())
    (spec,) = pyproject["project"]["optional-dependencies"]["vllm"]
    return re.fullmatch(r"vllm>=([\d.]+)", spec.replace(" ", "")).group(1)


def _images() -> set[str]:
    found = set()
    for dockerfile in (vs.REPO / "images").glob("*/Dockerfile"):
        found |= set(
            re.findall(r"^ARG VLLM_BASE=vllm/vllm-openai:v([\d.]+)", dockerfile.read_text(), re.M)
        )
    return found


LOWEST = _lowest()
VERSIONS = sorted({LOWEST, *_images(), NEWEST}, key=lambda v: tuple(map(int, v.split("."))))

#: The uses the check can't verify either way, each with the reason; the conformance test fails
#: on any other, which then needs a look (and a line here, or a fix in the extraction).
UNVERIFIABLE = {
    "vllm.v1.worker.gpu_worker.Worker().model_runner.model.load_weights": (
        "the served architecture's model class (vllm/model_executor/models/*), known only at run "
        "time, defines load_weights; vLLM's CUDA-graph wrappers pass it on through __getattr__"
    ),
}


@functools.cache
def _checked(version: str):
    try:
        source = vs.WheelSource(version)
        return source, vs.check_version(version, source=source)
    except vs.SourceUnavailable as e:
        return e


def checked(version: str) -> tuple[vs.WheelSource, vs.Report]:
    got = _checked(version)
    if isinstance(got, vs.SourceUnavailable):
        pytest.skip(f"vllm {version}'s source is neither cached nor reachable: {got}")
    return got


def test_the_versions_checked_span_the_supported_range():
    """The lowest from pyproject, the images' from their Dockerfiles (found: a renamed ARG
    would otherwise drop them silently), the newest last."""
    assert _images() and VERSIONS[0] == LOWEST and VERSIONS[-1] == NEWEST


def test_the_extraction_finds_what_the_backend_uses():
    """Without network: the uses the check looks up. A use the extraction stopped seeing would
    pass unchecked; this lists what it must at least see."""
    uses, rpcs, consts = vs.extract()
    shown = {vs.show(p) for u in uses for p in u.alternatives}
    assert {
        "vllm.LLM",
        "vllm.__version__",
        "vllm.SamplingParams",
        "vllm.inputs.TokensPrompt",
        "vllm.lora.request.LoRARequest",
        "vllm.LLM().get_tokenizer",
        "vllm.LLM().generate",
        "vllm.LLM().collective_rpc",
        "vllm.LLM().reset_prefix_cache",
        "vllm.LLM().llm_engine.engine_core.shutdown",
        "vllm.LLM().generate()[i].prompt_token_ids",
        "vllm.LLM().generate()[i].outputs[i].token_ids",
        "vllm.LLM().generate()[i].outputs[i].logprobs[i][k].logprob",
        "vllm.LLM().generate()[i].outputs[i].finish_reason",
        "vllm.v1.worker.gpu_worker.Worker().model_runner.model.load_weights",
    } <= shown

    def keywords(path: tuple[str, ...]) -> set[str]:
        return {k for u in uses if u.call and path in u.alternatives for k in u.keywords}

    assert {
        "model",
        "logprobs_mode",
        "enable_lora",
        "max_lora_rank",
        "limit_mm_per_prompt",
        "mm_processor_kwargs",
        "worker_extension_cls",
    } <= keywords(("vllm", "LLM"))
    assert {"n", "top_k", "stop_token_ids", "seed", "logprobs"} <= keywords(
        ("vllm", "SamplingParams")
    )
    assert {"use_tqdm", "lora_request"} <= keywords(("vllm", "LLM", "()", "generate"))
    # the shutdown in close(): one of the two must exist
    assert any(len(u.alternatives) == 2 and u.call for u in uses)
    assert {r.method for r in rpcs} == {"load_checkpoint", "receive_weights", "received_digests"}
    assert consts["worker_extension_cls"] == "components.model.vllm_worker.CheckpointLoader"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_backend_conforms_to_vllm(version):
    _, report = checked(version)
    assert report.errors == [], "\n".join(report.errors)
    assert set(report.unresolved) <= set(UNVERIFIABLE), report.unresolved
    assert report.checked > 40


@pytest.mark.parametrize("version", VERSIONS)
def test_the_lora_ranks_asked_for_are_ones_vllm_accepts(version):
    from components.model.vllm_backend import VLLM_MAX_LORA_RANKS

    source, _ = checked(version)
    accepted = vs.lora_ranks(source)
    assert accepted, f"vllm {version}: max_lora_rank's accepted values not found"
    assert set(VLLM_MAX_LORA_RANKS) <= accepted


@pytest.mark.parametrize("version", VERSIONS)
def test_a_lora_requests_positional_arguments_mean_what_the_backend_means(version):
    """set_adapter calls LoRARequest(name, id, path) positionally: the check counts them, this
    checks what they bind to."""
    source, _ = checked(version)
    sig = vs.signature(source, ("vllm", "lora", "request", "LoRARequest"))
    assert sig.positional[:3] == ["lora_name", "lora_int_id", "lora_path"]


def _doctored(version: str, member: str, cls: str, name: str, expected: str):
    return pytest.param(version, member, cls, name, expected, id=f"{version}-{cls}.{name}")


@pytest.mark.parametrize(
    "version, member, cls, name, expected",
    [
        _doctored(
            LOWEST,
            "vllm/sampling_params.py",
            "SamplingParams",
            "logprobs",
            "vllm.SamplingParams(): no keyword `logprobs` in "
            "vllm.sampling_params.SamplingParams (vllm/sampling_params.py:",
        ),
        _doctored(
            NEWEST,
            "vllm/sampling_params.py",
            "SamplingParams",
            "logprobs",
            "vllm.SamplingParams(): no keyword `logprobs`",
        ),
        _doctored(
            LOWEST, "vllm/entrypoints/llm.py", "LLM", "generate", "vllm.LLM() has no `generate`"
        ),
        _doctored(
            NEWEST, "vllm/entrypoints/llm.py", "LLM", "generate", "vllm.LLM() has no `generate`"
        ),
        # a keyword LLM.__init__ takes only through **kwargs, which it passes to EngineArgs
        _doctored(
            NEWEST,
            "vllm/engine/arg_utils.py",
            "EngineArgs",
            "worker_extension_cls",
            "vllm.LLM(): no keyword `worker_extension_cls`",
        ),
        # close(): neither way to shut the engine down left
        _doctored(
            LOWEST,
            "vllm/v1/engine/core_client.py",
            "EngineCoreClient",
            "shutdown",
            "vllm.LLM().llm_engine.engine_core.shutdown or vllm.LLM().llm_engine.shutdown",
        ),
    ],
)
def test_a_doctored_vllm_fails_the_check(version, member, cls, name, expected):
    source, _ = checked(version)
    doctored = vs.DoctoredSource(source, {member: vs.remove_member(source.read(member), cls, name)})
    report = vs.check_version(version, source=doctored)
    assert any(
        e.startswith("components/model/vllm_backend.py:") and expected in e for e in report.errors
    ), report.errors


def test_a_worker_method_the_backend_calls_must_exist(tmp_path):
    """`collective_rpc("name", args=...)` runs the worker extension's method `name` with those
    arguments: renaming it in the worker (a copy of the backend) fails the check."""
    source, _ = checked(LOWEST)
    for rel in vs.BACKEND_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(vs.REPO / rel, tmp_path / rel)
    worker = tmp_path / vs.BACKEND_FILES[1]
    worker.write_text(worker.read_text().replace("def received_digests(", "def digests("))
    uses = vs.extract(tmp_path)
    report = vs.fetching(source, lambda: vs.check(source, repo=tmp_path, uses=uses))
    assert any("has no received_digests" in e for e in report.errors), report.errors


def test_no_network_and_no_cache_is_a_clear_error(tmp_path, monkeypatch):
    """What the tests above turn into a skip: nothing listens on the discard port."""
    monkeypatch.setenv("RLVR_PYPI_URL", "http://127.0.0.1:9/pypi")
    with pytest.raises(vs.SourceUnavailable, match="unreachable"):
        vs.WheelSource(LOWEST, cache=tmp_path)
