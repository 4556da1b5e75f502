"""Hugging Face Hub ids as inputs, through huggingface_hub's own cache
code on a mirror directory (HF_HUB_CACHE, offline): no network."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from components.core import hub
from components.core.config import load_config
from pipelines.cli import main
from tests.support.runs import write_config

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def mirror(tmp_path: Path, tiny_assets: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hub cache holding model acme/tiny and dataset acme/arith (data/*.parquet)."""
    cache = tmp_path / "hub-cache"
    model = cache / "models--acme--tiny"
    shutil.copytree(tiny_assets / "base", model / "snapshots" / SHA)
    (model / "refs").mkdir()
    (model / "refs" / "main").write_text(SHA)
    data = cache / "datasets--acme--arith"
    (data / "snapshots" / SHA / "data").mkdir(parents=True)
    for name in ("train.parquet", "eval.parquet"):
        shutil.copy(tiny_assets / name, data / "snapshots" / SHA / "data" / name)
    (data / "refs").mkdir()
    (data / "refs" / "main").write_text(SHA)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.materialize.cache_clear()
    yield cache
    hub.materialize.cache_clear()


def test_bare_ids_become_hub_specs_unless_a_local_path_exists(tmp_path: Path, tiny_assets) -> None:
    path = write_config(tmp_path, tiny_assets)
    raw = yaml.safe_load(path.read_text())
    raw["model"]["base"] = "acme/tiny"
    raw["data"]["train"] = "acme/arith/data/train.parquet"
    raw["data"]["eval"][0]["path"] = "hf://datasets/acme/arith/data/eval.parquet@main"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert cfg.model.base == "hf://acme/tiny"
    assert cfg.data.train == "hf://datasets/acme/arith/data/train.parquet"
    assert cfg.data.eval[0].path == "hf://datasets/acme/arith/data/eval.parquet@main"
    (tmp_path / "acme" / "tiny").mkdir(parents=True)  # a local directory of that name wins
    assert load_config(path).model.base == str(tmp_path / "acme" / "tiny")
    # a relative path that is not id-shaped stays a (missing) local path
    assert load_config(path, ["model.base=./nope/base/x"]).model.base == str(
        tmp_path / "nope/base/x"
    )


def test_parse_and_errors() -> None:
    ref = hub.parse("hf://datasets/acme/arith/data/train.parquet@v1")
    assert (ref.repo_type, ref.repo_id, ref.filename, ref.revision) == (
        "dataset",
        "acme/arith",
        "data/train.parquet",
        "v1",
    )
    assert hub.parse("hf://Qwen/Qwen2.5-0.5B-Instruct").spec == "hf://Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(hub.HubError, match="names a Parquet file"):
        hub.parse("hf://datasets/acme/arith")
    with pytest.raises(hub.HubError, match=r"hf://OWNER/NAME\[@REVISION\]"):
        hub.parse("hf://a/b/c")


def test_init_copies_hub_inputs_and_records_the_revision(
    mirror: Path, tmp_path: Path, tiny_assets
) -> None:
    path = write_config(tmp_path, tiny_assets, model={"base": "acme/tiny"})
    raw = yaml.safe_load(path.read_text())
    raw["data"]["train"] = "hf://datasets/acme/arith/data/train.parquet"
    raw["data"]["eval"][0]["path"] = "acme/arith/data/eval.parquet"
    path.write_text(yaml.safe_dump(raw))
    assert CliRunner().invoke(main, ["check", str(path)]).exit_code == 0
    out = CliRunner().invoke(main, ["stage", "init", str(path)])
    assert out.exit_code == 0, out.output
    run = tmp_path / "runs" / "t"
    base = json.loads((run / "checkpoints/00000/_SUCCESS").read_text())
    train = json.loads((run / "data/train/_SUCCESS").read_text())
    assert base["stats"] == {"source": "hf://acme/tiny", "revision": SHA}
    assert train["stats"]["source"] == "hf://datasets/acme/arith/data/train.parquet"
    assert train["stats"]["revision"] == SHA and train["stats"]["rows"] > 0
    assert (run / "checkpoints/00000/model.safetensors").is_file()  # a copy: self-contained


def test_a_missing_hub_input_is_a_clear_error(mirror: Path, tmp_path: Path, tiny_assets) -> None:
    path = write_config(tmp_path, tiny_assets, model={"base": "acme/missing"})
    out = CliRunner().invoke(main, ["check", str(path)])
    assert out.exit_code == 2
    assert "hf://acme/missing: not in the local Hub cache and downloads are off" in out.output


def test_the_token_reaches_the_cluster_by_reference(tmp_path: Path, tiny_assets) -> None:
    path = write_config(tmp_path, tiny_assets)
    out_yaml = tmp_path / "p.yaml"
    res = CliRunner().invoke(
        main,
        ["compile", str(path), "-o", str(out_yaml), "--set", "cluster.hf_token_secret=hf-token"],
    )
    assert res.exit_code == 0, res.output
    text = out_yaml.read_text()
    _ir, platform = yaml.safe_load_all(text)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    refs = [
        s
        for e in executors.values()
        for s in e.get("secretAsEnv", [])
        if s["secretName"] == "hf-token"
    ]
    assert refs and all(
        r["keyToEnv"] == [{"secretKey": "HF_TOKEN", "envVar": "HF_TOKEN"}] for r in refs
    )


def test_what_a_prepare_step_builds_stays_local(tmp_path: Path, tiny_assets) -> None:
    # nothing exists yet, but the paths are the prepare step's outputs, or under a directory
    # that exists: local paths, never Hub ids
    path = write_config(tmp_path, tiny_assets)
    raw = yaml.safe_load(path.read_text())
    raw["prepare"] = {"module": "examples.arithmetic.prepare", "out": "build"}
    raw["model"]["base"] = "build/base"
    raw["data"]["train"] = "build/data/train.parquet"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert cfg.model.base == str(tmp_path / "build/base")
    assert cfg.data.train == str(tmp_path / "build/data/train.parquet")
    (tmp_path / "models").mkdir()
    assert load_config(path, ["model.base=models/base"]).model.base == str(tmp_path / "models/base")


def test_huggingface_hubs_own_dataset_form_is_accepted() -> None:
    ref = hub.parse("hf://datasets/acme/arith@v2/data/train.parquet")
    assert (ref.repo_id, ref.filename, ref.revision) == ("acme/arith", "data/train.parquet", "v2")
    assert hub.parse("hf://acme/tiny@abc").revision == "abc"
