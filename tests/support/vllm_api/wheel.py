"""The `.py` members of a released vLLM wheel, read without installing vLLM (a CUDA-only package).

The wheels are 300-450 MB; a check reads a few dozen members of ~10 kB, so they are read over
HTTP Range requests. PyPI's JSON API gives the wheel's URL; `zipfile` reads the central
directory through `HTTPRangeFile`, a seekable file over Range requests with a block cache.
Members are cached on disk (`WheelSource`), so a rerun needs no network.

Settings (environment): RLVR_PYPI_URL, the JSON API's base (default https://pypi.org/pypi; a
mirror serving the same API works), and RLVR_VLLM_SOURCE_CACHE, the cache folder (default
$XDG_CACHE_HOME or ~/.cache, then rlvr-vllm-source/<version>/).
"""

from __future__ import annotations

import io
import json
import os
import threading
import urllib.error
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from pathlib import Path
from urllib.parse import urljoin, urlsplit

TIMEOUT_S = 10.0
BLOCK = 32 * 1024


class SourceUnavailable(RuntimeError):
    """vLLM's source can't be had: no network (nor cache) or no such release."""


def pypi_url() -> str:
    return os.environ.get("RLVR_PYPI_URL", "https://pypi.org/pypi").rstrip("/")


def cache_root() -> Path:
    if os.environ.get("RLVR_VLLM_SOURCE_CACHE"):
        return Path(os.environ["RLVR_VLLM_SOURCE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rlvr-vllm-source"


#: Hosts found unreachable in this process: asked again, they'd cost a timeout per release.
_unreachable: dict[str, str] = {}


def _get_json(url: str) -> dict:
    host = urlsplit(url).netloc
    if host in _unreachable:
        raise urllib.error.URLError(_unreachable[host])
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            return json.load(r)
    except urllib.error.HTTPError:
        raise
    except OSError as e:
        _unreachable[host] = str(e)
        raise


def wheel_file(version: str) -> dict:
    """PyPI's record of the manylinux x86_64 wheel of vllm `version`, its `url` made absolute
    (a mirror may give a relative one)."""
    base = pypi_url()
    try:
        try:
            url = f"{base}/vllm/{version}/json"
            files = _get_json(url)["urls"]
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
            # some mirrors serve only the project's JSON, which lists every release
            url = f"{base}/vllm/json"
            files = _get_json(url)["releases"].get(version)
            if files is None:
                raise SourceUnavailable(f"vllm {version} is not on {base}") from None
    except urllib.error.HTTPError as e:
        raise SourceUnavailable(f"{base}: {e}") from None
    except (OSError, ValueError, HTTPException) as e:  # URLError, timeouts, bad JSON
        raise SourceUnavailable(f"{base} unreachable: {e}") from None
    wheels = [
        f
        for f in files
        if f["filename"].endswith(".whl")
        and "manylinux" in f["filename"]
        and "x86_64" in f["filename"]
    ]
    if not wheels:
        raise SourceUnavailable(f"vllm {version} has no manylinux x86_64 wheel on {base}")
    return dict(wheels[0], url=urljoin(url, wheels[0]["url"]))


class HTTPRangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP Range requests, with a block cache: `zipfile` reads
    the central directory and the members it is asked for, and nothing else comes over."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos = url, size, 0
        self.blocks: dict[int, bytes] = {}
        self.requests = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, start + offset)
        return self.pos

    def _range(self, start: int, end: int) -> bytes:
        """Bytes [start, end) in one request; an answer other than 206 is refused unread (a
        server that ignores Range would send the whole wheel)."""
        with self._lock:
            self.requests += 1
        headers = {"Range": f"bytes={start}-{end - 1}"}
        host = urlsplit(self.url).netloc
        if host in _unreachable:
            raise SourceUnavailable(f"{host} unreachable: {_unreachable[host]}")
        try:
            status, content_range, data = self._get(headers)
        except (OSError, HTTPException) as e:
            _unreachable[host] = str(e)
            raise SourceUnavailable(f"{self.url}: {e}") from None
        if status != 206 or not content_range.startswith(f"bytes {start}-"):
            raise SourceUnavailable(f"{self.url}: no Range support (HTTP {status})")
        if len(data) != end - start:
            raise SourceUnavailable(f"{self.url}: short read at {start}")
        return data

    def _get(self, headers: dict) -> tuple[int, str, bytes]:
        """One GET: on a kept-alive connection of this thread's (each request on a new one
        costs a TLS handshake), or through urllib where a proxy is configured."""
        split = urlsplit(self.url)
        if urllib.request.getproxies() and not urllib.request.proxy_bypass(split.hostname or ""):
            req = urllib.request.Request(self.url, headers=headers)
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
                if r.status != 206:
                    return r.status, "", b""
                return r.status, r.headers.get("Content-Range", ""), r.read()
        path = split.path + (f"?{split.query}" if split.query else "")
        for attempt in (0, 1):  # a kept-alive connection the server has closed: once more
            conn = getattr(self._local, "conn", None)
            if conn is None:
                cls = HTTPSConnection if split.scheme == "https" else HTTPConnection
                conn = self._local.conn = cls(split.netloc, timeout=TIMEOUT_S)
            try:
                conn.request("GET", path, headers=headers)
                r = conn.getresponse()
                if r.status != 206:
                    conn.close()  # not reading a whole wheel to keep the connection
                    self._local.conn = None
                    return r.status, "", b""
                return r.status, r.headers.get("Content-Range", ""), r.read()
            except (OSError, HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError

    def fetch(self, start: int, end: int) -> None:
        """Bring bytes [start, end) into the block cache: each run of missing blocks in one
        request."""
        first, last = start // BLOCK, (min(end, self.size) - 1) // BLOCK
        run: list[int] = []
        for b in [*range(first, last + 1), None]:
            if b is not None and b not in self.blocks:
                run.append(b)
                continue
            if run:
                lo, hi = run[0] * BLOCK, min((run[-1] + 1) * BLOCK, self.size)
                data = self._range(lo, hi)
                with self._lock:
                    for i, blk in enumerate(run):
                        self.blocks[blk] = data[i * BLOCK : (i + 1) * BLOCK]
                run = []

    def readinto(self, buf) -> int:
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        self.fetch(self.pos, self.pos + n)
        out = bytearray()
        for b in range(self.pos // BLOCK, (self.pos + n - 1) // BLOCK + 1):
            out += self.blocks[b]
        lo = self.pos - (self.pos // BLOCK) * BLOCK
        buf[:n] = out[lo : lo + n]
        self.pos += n
        return n


class WheelSource:
    """The `vllm/**.py` members of one release's wheel, from the disk cache or, for those not
    there yet, over HTTP. `read` never touches the network: it answers from the cache and notes
    what it lacked in `wanted`; `fetch_wanted` brings those over, all at once."""

    def __init__(self, version: str, cache: Path | None = None) -> None:
        self.version = version
        self.dir = (cache or cache_root()) / version
        self.wanted: set[str] = set()
        self._zip: zipfile.ZipFile | None = None
        self._raw: HTTPRangeFile | None = None
        self._pool: ThreadPoolExecutor | None = None
        index = self.dir / "index.json"
        if index.exists():
            self.index = json.loads(index.read_text())
        else:
            self.index = self._fetch_index()
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = index.with_suffix(f".{os.getpid()}.tmp")  # test workers fetch side by side
            tmp.write_text(json.dumps(self.index))
            tmp.replace(index)
        self.files: set[str] = set(self.index["members"])

    def _open(self) -> zipfile.ZipFile:
        if self._zip is None:
            wheel = self.index["wheel"]
            self._raw = HTTPRangeFile(wheel["url"], wheel["size"])
            try:
                # unbuffered: a buffer would read ahead past each member, a request each
                self._zip = zipfile.ZipFile(self._raw)
            except zipfile.BadZipFile as e:
                raise SourceUnavailable(f"{wheel['url']}: {e}") from None
        return self._zip

    def _fetch_index(self) -> dict:
        wheel = wheel_file(self.version)
        self.index = {"wheel": {k: wheel[k] for k in ("filename", "url", "size", "digests")}}
        z = self._open()
        members = {
            i.filename: [i.header_offset, i.compress_size]
            for i in z.infolist()
            if i.filename.startswith("vllm/") and i.filename.endswith(".py")
        }
        return dict(self.index, members=members)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def read(self, path: str) -> str | None:
        """The text of member `path` if it is cached; None (and noted in `wanted`) if not."""
        if path not in self.files:
            return None
        f = self.dir / "src" / path
        if f.exists():
            return f.read_text(encoding="utf-8")
        self.wanted.add(path)
        return None

    def fetch_wanted(self) -> None:
        paths = sorted(self.wanted)
        self.wanted.clear()
        if not paths:
            return
        z = self._open()
        raw = self._raw
        assert raw is not None
        spans = []
        for p in paths:
            off, size = self.index["members"][p]
            # the local header: 30 bytes, the name, an extra field (rarely over a few dozen)
            spans.append((off, min(raw.size, off + 30 + len(p.encode()) + 512 + size)))
        if self._pool is None:  # kept across rounds: its threads keep their connections
            self._pool = ThreadPoolExecutor(8, thread_name_prefix="vllm-source")
        list(self._pool.map(lambda s: raw.fetch(*s), spans))
        for p in paths:
            data = z.read(p)  # from the block cache; zipfile checks the CRC
            out = self.dir / "src" / p
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(out)


class DoctoredSource:
    """Another source with some members' text replaced (tests: the check must catch it)."""

    def __init__(self, base, replace: dict[str, str]) -> None:
        self.base, self.replace = base, replace
        self.version = f"{base.version}+doctored"
        self.files = base.files
        self.wanted = base.wanted

    def read(self, path: str) -> str | None:
        return self.replace[path] if path in self.replace else self.base.read(path)

    def fetch_wanted(self) -> None:
        self.base.fetch_wanted()
