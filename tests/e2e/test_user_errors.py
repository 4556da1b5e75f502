"""Which errors are the user's (exit status 2, one line, no traceback) and which are bugs: only
a UserError or the store's own errors are the user's; a bare ValueError or FileNotFoundError
keeps its traceback."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from components.core.commit import NotCommittedError
from components.core.errors import USER_ERRORS, StageError, UserError, is_user_error
from components.core.stage_cli import run_stage
from components.core.store import LocalStore, StoreError
from components.core.warm import RunStatus


def _raising(error: BaseException):
    def stage(cfg, **kwargs):
        raise error

    return stage


def test_a_bare_value_error_in_a_stage_keeps_its_traceback(capsys):
    with pytest.raises(ValueError, match="a bug, not bad input") as e:
        run_stage(_raising(ValueError("a bug, not bad input")), cfg=None)
    assert type(e.value) is ValueError  # not turned into SystemExit(2)
    assert capsys.readouterr().err == ""


def test_a_missing_file_in_a_stage_keeps_its_traceback():
    with pytest.raises(FileNotFoundError):
        run_stage(_raising(FileNotFoundError("/internal/scratch")), cfg=None)


@pytest.mark.parametrize(
    "error",
    [
        UserError("data.train: x.parquet row 3: prompt is empty"),
        StageError("data.train: x.parquet row 3: prompt is empty"),
    ],
)
def test_a_user_error_in_a_stage_is_one_line_and_exit_status_2(error, capsys):
    with pytest.raises(SystemExit) as e:
        run_stage(_raising(error), cfg=None)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: data.train: x.parquet row 3: prompt is empty\n"


def test_a_stage_result_passes_through():
    assert run_stage(lambda cfg, **kw: {"cfg": cfg, **kw}, "c", iteration=3) == {
        "cfg": "c",
        "iteration": 3,
    }


@pytest.mark.parametrize(
    "error",
    [UserError("u"), StageError("s"), StoreError("s3 denied"), NotCommittedError("x/_SUCCESS")],
)
def test_user_errors(error):
    assert is_user_error(error)
    assert isinstance(error, USER_ERRORS)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("v"),
        FileNotFoundError("f"),
        pa.lib.ArrowInvalid("a"),
        KeyError("k"),
        RuntimeError("r"),
        TypeError("t"),
    ],
)
def test_not_user_errors(error):
    assert not is_user_error(error)


def _error_classes() -> dict[str, type]:
    from components.core.config import ConfigError
    from components.core.errors import PreflightError
    from components.core.hub import HubError
    from components.core.schemas import SchemaError
    from components.generate.tools import ToolError
    from components.model.adapter import AdapterError
    from components.model.checkpoint import CheckpointError
    from components.train.algorithms import UnknownNameError
    from components.train.state import TrainStateError
    from components.verify.code.cases import InvalidTestCases

    return {
        c.__name__: c
        for c in (
            ConfigError,
            SchemaError,
            CheckpointError,
            HubError,
            AdapterError,
            TrainStateError,
            ToolError,
            InvalidTestCases,
            UnknownNameError,
            PreflightError,
            StageError,
        )
    }


@pytest.mark.parametrize("name", sorted(_error_classes()))
def test_every_named_error_class_is_a_user_error(name):
    cls = _error_classes()[name]
    assert issubclass(cls, UserError), f"{name} is not a UserError"
    assert issubclass(cls, ValueError)  # callers that catch ValueError still do


def test_unknown_name_error_is_also_a_key_error():
    from components.train.algorithms import UnknownNameError, get_advantage_fn

    with pytest.raises(UnknownNameError) as e:
        get_advantage_fn("grpoo")
    assert isinstance(e.value, KeyError) and is_user_error(e.value)


def test_a_warm_workers_failure_marker_says_whose_fault_it_was(tmp_path):
    status = RunStatus(LocalStore(), str(tmp_path))
    status.mark_failed("user", UserError("data.train: no rows"))
    status.mark_failed("bug", ValueError("index out of range"))
    failures = status.failures()
    assert failures["user"]["user_error"] is True
    assert failures["user"]["error"] == "data.train: no rows"
    assert failures["bug"]["user_error"] is False
    assert failures["bug"]["error"] == "ValueError: index out of range"


# Raise sites of user mistakes: each is the user's to fix, so each must be a UserError.


def test_a_bad_verifier_spec_is_a_user_error(tmp_path):
    from components.verify.rewards import get_verifier, load_plugin

    for call in (
        lambda: get_verifier("mathh"),
        lambda: load_plugin("no-colon"),
        lambda: load_plugin(f"{tmp_path}/missing.py:f"),
        lambda: load_plugin("no_such_module_xyz:f"),
    ):
        with pytest.raises(UserError):
            call()


def test_a_plugin_returning_nonsense_is_a_user_error(tmp_path):
    from components.verify.rewards import load_plugin

    plugin = tmp_path / "p.py"
    plugin.write_text("def f(*a):\n    return 'yes'\n")
    with pytest.raises(UserError, match="the score must be a finite number"):
        load_plugin(f"{plugin}:f")("1", "1")


def test_config_driven_refusals_are_user_errors():
    from components.core.commit import check_shard
    from components.generate.environments import ws_url
    from components.generate.prompt_sampler import select_indices

    with pytest.raises(UserError, match="exceeds the 4 rows"):
        select_indices(4, 5, seed=0, iteration=0)
    with pytest.raises(UserError, match="--shard 2 --num-shards 2"):
        check_shard(2, 2)
    with pytest.raises(UserError, match="generate.environment.url"):
        ws_url("host:1")


def test_an_overlong_buffer_past_max_length_is_a_config_error(tmp_path):
    # It used to pass the config and fail in the verify stage with a bare ValueError.
    from components.core.config import ConfigError, load_config

    path = tmp_path / "config.yaml"
    path.write_text(
        "model: {base: b}\ndata: {train: t.parquet}\n"
        "verify: {overlong_penalty: {max_length: 4, buffer: 8}}\n"
    )
    with pytest.raises(ConfigError, match=r"verify\.overlong_penalty\.buffer.*max_length \(4\)"):
        load_config(path)


@pytest.mark.parametrize(
    "key, value, ok",
    [
        ("cpu_request", "eight", False),
        ("cpu_request", "500m", True),
        ("cpu_limit", "0.5", True),
        ("memory_limit", "64Gi", True),
        ("memory_request", "64 GB", False),
        ("shm_size", "16Gi", True),
    ],
)
def test_cluster_quantities_are_checked_when_the_config_loads(key, value, ok):
    """A Kubernetes quantity KFP would refuse at compile time (with a bare ValueError and a
    traceback) is a ConfigError naming the key when the config loads."""
    from components.core.config import ConfigError, load_config

    config = Path(__file__).resolve().parents[2] / "examples/arithmetic/config.yaml"
    overrides = [f"cluster.stages.train.{key}={value}"]
    if ok:
        load_config(config, overrides)
        return
    with pytest.raises(ConfigError, match=f"cluster.stages.train.{key}"):
        load_config(config, overrides)
