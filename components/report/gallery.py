"""Image prompts on the dashboard: a few held-out images with the base's and the last evaluated
checkpoint's responses to them, side by side. The images are read from the run's
copy of the eval set through the samples' `images_ref` (docs/contracts.md), shrunk to
thumbnails and embedded, so the page stays one self-contained file."""

from __future__ import annotations

import html
import io
from typing import Any

from components.core.layout import RunLayout
from components.core.store import Store, join

#: Prompts shown per eval set, thumbnails' longest side in pixels, samples listed per prompt.
PROMPTS = 6
THUMBNAIL = 112
SAMPLES = 4


def _samples(store: Store, layout: RunLayout, c: int, name: str):
    import pyarrow.parquet as pq

    from components.core.store import StoreError

    uri = join(layout.eval_set(c, name), "samples.parquet")
    local = store.local_path(uri)
    try:
        source = local if local is not None else io.BytesIO(store.read_bytes(uri))
        t = pq.ParquetFile(source).read()
    except (OSError, StoreError):
        return None
    return t if "images_ref" in t.column_names else None


def _thumbnails(store: Store, root: str, ref: str) -> list[bytes]:
    import pyarrow.parquet as pq
    from PIL import Image

    from components.model.vision import IMAGE_COLUMN, image_bytes

    path, _, row = ref.rpartition("#")
    uri = path if "://" in path or path.startswith("/") else join(root, path)
    local = store.local_path(uri)
    source = local if local is not None else io.BytesIO(store.read_bytes(uri))
    entries = pq.ParquetFile(source).read(columns=[IMAGE_COLUMN]).column(0)[int(row)].as_py()
    out = []
    for e in entries or []:
        with Image.open(io.BytesIO(image_bytes(e) or b"")) as im:
            im = im.convert("RGB")
            scale = THUMBNAIL / max(im.size)
            im = im.resize(
                (max(1, round(im.width * scale)), max(1, round(im.height * scale))),
                Image.Resampling.NEAREST,  # synthetic images stay crisp
            )
            buf = io.BytesIO()
            im.save(buf, "PNG")
            out.append(buf.getvalue())
    return out


def image_gallery(store: Store, root: str, checkpoints: list[int]) -> str:
    """The dashboard section (HTML), or "" when no evaluated set has image prompts (or they
    cannot be read: the gallery never stops the report). `checkpoints`: the evaluated ones, in
    order; the first and the last are shown."""
    import logging

    try:
        return _gallery(store, root, checkpoints)
    except Exception as e:  # noqa: BLE001 - a picture on a page; the report goes on without it
        logging.getLogger("rlvr.report").warning("no image gallery on the dashboard: %s", e)
        return ""


def _gallery(store: Store, root: str, checkpoints: list[int]) -> str:
    from components.report.dashboard import _data_uri

    if not checkpoints:
        return ""
    layout = RunLayout(root.rstrip("/"))
    first, last = checkpoints[0], checkpoints[-1]
    names = sorted(
        f.split("/", 1)[0]
        for f in store.list_files(layout.evals(last))
        if f.endswith("/samples.parquet")
    )
    blocks = []
    for name in names:
        late = _samples(store, layout, last, name)
        if late is None:
            continue
        early = _samples(store, layout, first, name) if first != last else None
        with_images = [
            p
            for p, ref in zip(
                late.column("prompt_id").to_pylist(),
                late.column("images_ref").to_pylist(),
                strict=True,
            )
            if ref
        ]
        ids = list(dict.fromkeys(with_images))[:PROMPTS]
        rows = []
        for pid in ids:
            shown = (first, last) if early is not None else (last,)
            got = {
                c: _responses(t, pid) for c, t in ((first, early), (last, late)) if t is not None
            }
            ref = got[last]["ref"]
            imgs = "".join(
                f'<img src="{_data_uri(png)}" alt="{html.escape(pid)}" width="{THUMBNAIL}" '
                'style="border: 1px solid #d0d7de; margin: 2px">'
                for png in _thumbnails(store, root, ref)
            )
            cells = "".join(
                f'<td style="text-align: left">{_listing(got[c]["samples"]) if got.get(c) else "—"}'
                "</td>"
                for c in shown
            )
            truth = html.escape(got[last]["truth"])
            rows.append(f"<tr><td>{imgs}</td><td><code>{truth}</code></td>{cells}</tr>")
        heads = "".join(
            f"<th>checkpoint {c}</th>" for c in ((first, last) if early is not None else (last,))
        )
        blocks.append(
            f"<h3>{html.escape(name)}</h3><table><tr><th>image</th><th>answer</th>{heads}"
            f"</tr>{''.join(rows)}</table>"
        )
    if not blocks:
        return ""
    return (
        '<section id="images"><h2>Image prompts</h2><p class="note">The first held-out images '
        f"of each set with up to {SAMPLES} sampled responses, at the base and the last "
        "evaluated checkpoint (&#10003; rewarded, &#10007; not).</p>"
        + "".join(blocks)
        + "</section>"
    )


def _responses(table, prompt_id: str) -> dict[str, Any] | None:
    import pyarrow.compute as pc

    rows = table.filter(pc.equal(table.column("prompt_id"), prompt_id)).to_pylist()
    if not rows:  # not in this checkpoint's samples (another max_prompts)
        return None
    rows.sort(key=lambda r: r["sample_index"])
    return {
        "ref": rows[0]["images_ref"],
        "truth": rows[0]["ground_truth"],
        "samples": [(r["response"], r["reward"]) for r in rows[:SAMPLES]],
    }


def _listing(samples: list[tuple[str, float]]) -> str:
    return "<br>".join(
        f"{'&#10003;' if reward and reward > 0 else '&#10007;'} <code>{html.escape(text)}</code>"
        for text, reward in samples
    )
