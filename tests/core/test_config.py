"""Config validation: unknown keys and bad values name the key, value and expected form."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from components.core.config import ConfigError, RunConfig, apply_overrides, load_config


def test_defaults_and_path_resolution(workspace, tiny_assets):
    cfg = load_config(workspace)
    assert cfg.run_id == "t"
    assert cfg.model.base == str(tiny_assets / "base")
    assert cfg.train.loss_agg == "token-mean"
    assert RunConfig.from_json(cfg.to_json()) == cfg


def test_relative_paths_resolve_against_the_config_dir(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"base": "m"}, "data": {"train": "d/t.parquet"}}))
    cfg = load_config(path)
    assert cfg.model.base == str(tmp_path / "sub" / "m")
    assert cfg.data.train == str(tmp_path / "sub" / "d" / "t.parquet")
    assert cfg.run.run_id == "sub"  # defaults to the config's folder name


def test_unknown_key_is_named(workspace):
    raw = yaml.safe_load(workspace.read_text())
    raw["train"]["learning_rate"] = 0.1
    workspace.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"train\.learning_rate: unknown key \(value 0\.1\)"):
        load_config(workspace)


def test_bad_value_names_key_value_and_form(workspace):
    with pytest.raises(ConfigError) as e:
        load_config(workspace, ["generate.n=0"])
    assert "generate.n: got 0" in str(e.value) and "greater than or equal to 1" in str(e.value)
    with pytest.raises(ConfigError, match=r"generate\.backend: got 'tpu'"):
        load_config(workspace, ["generate.backend=tpu"])


def test_overrides_are_typed_and_validated(workspace):
    cfg = load_config(workspace, ["train.lr=3e-4", 'generate.stop=["\\n"]', "run.iterations=5"])
    assert cfg.train.lr == 3e-4 and cfg.generate.stop == ["\n"] and cfg.run.iterations == 5
    with pytest.raises(ConfigError, match="not of the form"):
        apply_overrides({}, ["train.lr"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_cli_malformed_config_exits_nonzero_with_message(workspace):
    raw = yaml.safe_load(workspace.read_text())
    raw["generate"]["temperature"] = -1
    workspace.write_text(yaml.safe_dump(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "stage", "generate", str(workspace)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "generate.temperature: got -1" in proc.stderr
    assert not (workspace.parent / "runs").exists()  # nothing written


def test_a_temperature_vllm_refuses_is_named_before_any_work(workspace):
    with pytest.raises(ConfigError, match=r"generate\.temperature: 2\.5 is above 2, which vLLM"):
        load_config(workspace, ["generate.backend=vllm", "generate.temperature=2.5"])
    with pytest.raises(ConfigError, match=r"data\.eval\.heldout\.temperature: 3\.0 is above 2"):
        load_config(workspace, ["generate.backend=vllm", "data.eval.0.temperature=3.0"])
    assert load_config(workspace, ["generate.temperature=2.5"]).generate.temperature == 2.5
    assert load_config(workspace, ["generate.backend=vllm", "generate.temperature=2"])
