"""Weight files streamed one tensor at a time (components/model/weights.py): what safetensors and
transformers read back, the sha256 computed while writing, and the names save_pretrained uses."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors import safe_open

from components.model.checkpoint import saved_names
from components.model.weights import (
    INDEX_NAME,
    Entry,
    FileWriter,
    HashSink,
    index_json,
    ordered,
    plan_order,
    shard_plan,
    write_files,
)


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "b.weight": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "a.weight": torch.randn(7, generator=g),
        "c.ids": torch.arange(4, dtype=torch.int64),
        "d.flag": torch.tensor([True, False, True]),
        "e.scalar": torch.tensor(2.5, dtype=torch.float16),
    }


def write(path, ts: dict[str, torch.Tensor], metadata=None) -> tuple[str, int]:
    entries = ordered(Entry(k, v.dtype, tuple(v.shape)) for k, v in ts.items())
    with open(path, "wb") as f:
        w = FileWriter(f, entries, metadata)
        for e in entries:
            w.put(e.name, ts[e.name])
        info = w.close()
    return info.sha256, info.bytes


def test_a_streamed_file_reads_back_with_safetensors_and_hashes_as_written(tmp_path):
    ts = tensors()
    path = tmp_path / "x.safetensors"
    sha, nbytes = write(path, ts, {"format": "pt"})
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    assert nbytes == path.stat().st_size
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert set(f.keys()) == set(ts)
        for k, v in ts.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and torch.equal(got, v), k
    # every tensor starts at a multiple of its item size (the header is padded to 8 bytes)
    n = int.from_bytes(path.read_bytes()[:8], "little")
    assert n % 8 == 0
    header = json.loads(path.read_bytes()[8 : 8 + n])
    for k, v in ts.items():
        assert header[k]["data_offsets"][0] % v.element_size() == 0, k


def test_the_same_tensors_give_the_same_bytes_and_hash_only_needs_no_file(tmp_path):
    """Deterministic layout: the order tensors are put in is the declared order, whatever the
    dict's; a HashSink gives the digest of the file without writing it."""
    ts = tensors()
    a, _ = write(tmp_path / "a", ts)
    b, _ = write(tmp_path / "b", dict(reversed(list(ts.items()))))
    assert a == b
    entries = ordered(Entry(k, v.dtype, tuple(v.shape)) for k, v in ts.items())
    w = FileWriter(HashSink(), entries)
    for e in entries:
        w.put(e.name, ts[e.name])
    assert w.close().sha256 == a


def test_a_writer_refuses_a_tensor_out_of_order_or_of_another_shape(tmp_path):
    ts = tensors()
    entries = ordered(Entry(k, v.dtype, tuple(v.shape)) for k, v in ts.items())
    w = FileWriter(HashSink(), entries)
    with pytest.raises(ValueError, match="expected tensor"):
        w.put(entries[1].name, ts[entries[1].name])
    w = FileWriter(HashSink(), entries)
    with pytest.raises(ValueError, match="declared"):
        w.put(entries[0].name, ts[entries[0].name].float().double())
    w = FileWriter(HashSink(), entries)
    with pytest.raises(ValueError, match="never written"):
        w.close()


def test_shards_and_their_index_split_as_transformers_names_them(tmp_path):
    ts = {f"layer.{i}.weight": torch.full((250,), float(i)) for i in range(6)}  # 1000 B each
    entries = [Entry(k, v.dtype, tuple(v.shape)) for k, v in ts.items()]
    plan = shard_plan(entries, max_shard_bytes=2500)
    assert list(plan) == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert [len(es) for es in plan.values()] == [2, 2, 2]
    stream = ((e.name, ts[e.name]) for e in plan_order(plan))
    infos = write_files(tmp_path, plan, stream, {"format": "pt"})
    index = json.loads(index_json(plan))
    assert index["metadata"]["total_size"] == 6000
    for name, fname in index["weight_map"].items():
        with safe_open(str(tmp_path / fname), framework="pt") as f:
            assert torch.equal(f.get_tensor(name), ts[name])
    for fname, info in infos.items():
        assert info.sha256 == hashlib.sha256((tmp_path / fname).read_bytes()).hexdigest()
    assert shard_plan(entries) and index_json(shard_plan(entries)) is None  # one file: no index
    assert INDEX_NAME == "model.safetensors.index.json"


@pytest.mark.parametrize("kind", ["text", "vision"])
def test_saved_names_are_save_pretrameds(kind, tmp_path):
    """The streamed checkpoint stores every tensor under the name save_pretrained gives it (a
    Qwen2-VL's `model.language_model.*` as `model.*`, `model.visual.*` as `visual.*`), which
    transformers 4.x and vLLM load."""
    from examples.arithmetic.model import build_model as build_text
    from examples.arithmetic.model import build_tokenizer as text_tokenizer

    if kind == "text":
        model = build_text(text_tokenizer())
    else:
        from examples.vision_count.model import build_model, build_tokenizer

        model = build_model(build_tokenizer())
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        expected = set(f.keys())
    params = dict(model.named_parameters())
    taken = {id(p) for p in params.values()}
    names = [
        n
        for n, v in model.state_dict(keep_vars=True).items()
        if n in params or id(v) not in taken  # tied aliases once, as the handoff takes them
    ]
    assert set(saved_names(model, names).values()) == expected
