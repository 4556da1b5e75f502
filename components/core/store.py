"""Object store: every location is a URI, a local path / file:// URI or s3://bucket/prefix.

Stages talk to storage only through `Store`. Local paths are the default (a laptop run writes
under ./rlvr-runs/); `s3://` goes through boto3, so MinIO or any S3 server works. The endpoint
comes from config (`run.s3_endpoint_url`) or the standard AWS environment (AWS_ENDPOINT_URL);
credentials come only from the standard AWS chain (env, profile, IRSA), never from config.

Writes are atomic per object: local files are written to a temporary name and renamed; S3 PUTs
are atomic by nature. Directory-level atomicity is the `_SUCCESS` protocol in `commit.py`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path


class StoreError(RuntimeError):
    """A storage operation failed; the message names the URI."""


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def join(base: str, *parts: str) -> str:
    """Join URI path parts with '/' (works for local paths and s3://)."""
    out = base.rstrip("/")
    for p in parts:
        p = str(p).strip("/")
        if p:
            out = f"{out}/{p}"
    return out


def _local_path(uri: str) -> Path:
    return Path(uri[len("file://") :] if uri.startswith("file://") else uri)


class Store(ABC):
    """Byte-level access to one storage backend. All paths are full URIs."""

    @abstractmethod
    def read_bytes(self, uri: str) -> bytes: ...

    @abstractmethod
    def write_bytes(self, uri: str, data: bytes) -> None: ...

    @abstractmethod
    def exists(self, uri: str) -> bool: ...

    @abstractmethod
    def list_files(self, uri: str) -> list[str]:
        """Relative paths of every object under `uri` (recursive), sorted."""

    @abstractmethod
    def delete_tree(self, uri: str) -> None:
        """Remove every object under `uri` (no error if there is none)."""

    @abstractmethod
    def delete(self, uri: str) -> None:
        """Remove one object (no error if it does not exist)."""

    @abstractmethod
    def upload_file(self, local: Path, uri: str) -> None: ...

    @abstractmethod
    def download_file(self, uri: str, local: Path) -> None: ...

    def local_path(self, uri: str) -> Path | None:
        """The file behind `uri` when it is on this machine's filesystem (None on S3)."""
        return None

    def move_file(self, local: Path, uri: str) -> None:
        """Put a local file at `uri` and remove it locally (a rename where possible)."""
        self.upload_file(local, uri)
        Path(local).unlink(missing_ok=True)

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode()

    def write_text(self, uri: str, text: str) -> None:
        self.write_bytes(uri, text.encode())

    def list_dirs(self, uri: str) -> list[str]:
        """Names of the immediate sub-directories under `uri`, sorted."""
        return sorted({f.split("/", 1)[0] for f in self.list_files(uri) if "/" in f})


def _process_umask() -> int:
    """The process's umask, read without changing it where Linux says it (setting and
    restoring it is process-wide, racy with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _process_umask()


def _temp_beside(path: Path) -> tuple[int, str]:
    """A temporary file next to `path` for an atomic replace, with the mode an ordinary
    `open()` would give it (0o666 less the umask): mkstemp's 0o600 would survive the rename and
    leave every committed file readable by its writer alone, so a task running as another uid
    (a container, a second user of a shared store) could not read the run."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_UMASK)
    return fd, tmp


def ordinary_modes(path: str | Path) -> None:
    """Give `path` (a file, or a directory and everything under it) the modes an ordinary
    mkdir / open would have: what mkdtemp (0o700), mkstemp and transformers 5's safetensors
    writer (0o600) leave would otherwise make an input or a run readable by its writer alone,
    and a task running as another uid (a container's) could not read it."""
    root = Path(path)
    for p in [root, *root.rglob("*")] if root.is_dir() else [root]:
        if p.is_symlink():
            continue
        executable = p.is_dir() or p.stat().st_mode & 0o100
        os.chmod(p, (0o777 if executable else 0o666) & ~_UMASK)


class LocalStore(Store):
    def local_path(self, uri: str) -> Path | None:
        return _local_path(uri)

    def read_bytes(self, uri: str) -> bytes:
        try:
            return _local_path(uri).read_bytes()
        except OSError as e:
            raise StoreError(f"cannot read {uri}: {e.strerror or e}") from e

    def write_bytes(self, uri: str, data: bytes) -> None:
        path = _local_path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _temp_beside(path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def exists(self, uri: str) -> bool:
        return _local_path(uri).exists()

    def list_files(self, uri: str) -> list[str]:
        # os.walk, not rglob: a directory another process deletes mid-listing (a stage
        # rewriting its output while a worker polls it) is skipped instead of raising.
        root = _local_path(uri)
        out = []
        for folder, _, names in os.walk(root):
            rel = Path(folder).relative_to(root)
            out += [
                (rel / n).as_posix()
                for n in names
                if not n.endswith(".tmp") and os.path.isfile(os.path.join(folder, n))
            ]
        return sorted(out)

    def delete_tree(self, uri: str) -> None:
        path = _local_path(uri)
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()

    def delete(self, uri: str) -> None:
        _local_path(uri).unlink(missing_ok=True)

    def upload_file(self, local: Path, uri: str) -> None:
        dest = _local_path(uri)
        if Path(local).resolve() == dest.resolve():
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _temp_beside(dest)
        os.close(fd)
        try:
            shutil.copyfile(local, tmp)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def move_file(self, local: Path, uri: str) -> None:
        dest = _local_path(uri)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(local, dest)  # atomic; fails across filesystems
        except OSError:
            self.upload_file(local, uri)
            Path(local).unlink(missing_ok=True)
        else:
            ordinary_modes(dest)

    def download_file(self, uri: str, local: Path) -> None:
        src = _local_path(uri)
        if not src.is_file():
            raise StoreError(f"cannot read {uri}: no such file")
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local)


class S3Store(Store):
    """S3 through boto3; retries come from botocore's standard retry mode."""

    def __init__(self, endpoint_url: str | None = None) -> None:
        self.endpoint_url = endpoint_url
        import boto3
        from botocore.config import Config

        self._client = boto3.client(
            "s3",
            endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
            config=Config(retries={"max_attempts": 8, "mode": "standard"}),
        )

    @staticmethod
    def _split(uri: str) -> tuple[str, str]:
        rest = uri[len("s3://") :]
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise StoreError(f"bad S3 URI {uri!r}: expected s3://bucket/key")
        return bucket, key

    def _call(self, uri: str, what: str, fn, *args, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "?")
            raise StoreError(f"cannot {what} {uri}: S3 error {code}") from e
        except BotoCoreError as e:
            raise StoreError(f"cannot {what} {uri}: {e}") from e

    def read_bytes(self, uri: str) -> bytes:
        bucket, key = self._split(uri)
        obj = self._call(uri, "read", self._client.get_object, Bucket=bucket, Key=key)
        return obj["Body"].read()

    def write_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = self._split(uri)
        self._call(uri, "write", self._client.put_object, Bucket=bucket, Key=key, Body=data)

    def exists(self, uri: str) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = self._split(uri)
        try:
            self._client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return bool(self.list_files(uri))
            raise StoreError(f"cannot stat {uri}: {e}") from e

    def list_files(self, uri: str) -> list[str]:
        bucket, key = self._split(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        out: list[str] = []
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in self._call(uri, "list", lambda: list(pages)):
            out.extend(o["Key"][len(prefix) :] for o in page.get("Contents", []))
        return sorted(out)

    def delete_tree(self, uri: str) -> None:
        bucket, key = self._split(uri)
        files = self.list_files(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        for i in range(0, len(files), 1000):
            chunk = [{"Key": prefix + f} for f in files[i : i + 1000]]
            reply = self._call(
                uri, "delete", self._client.delete_objects, Bucket=bucket, Delete={"Objects": chunk}
            )
            if reply.get("Errors"):
                first = reply["Errors"][0]
                raise StoreError(
                    f"cannot delete {len(reply['Errors'])} objects under {uri}: first "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message', '')}"
                )

    def delete(self, uri: str) -> None:
        bucket, key = self._split(uri)
        self._call(uri, "delete", self._client.delete_object, Bucket=bucket, Key=key)

    def upload_file(self, local: Path, uri: str) -> None:
        bucket, key = self._split(uri)
        self._call(uri, "upload", self._client.upload_file, str(local), bucket, key)

    def download_file(self, uri: str, local: Path) -> None:
        bucket, key = self._split(uri)
        local.parent.mkdir(parents=True, exist_ok=True)
        self._call(uri, "download", self._client.download_file, bucket, key, str(local))


def get_store(uri: str, endpoint_url: str | None = None) -> Store:
    """The store that serves `uri`."""
    if is_s3(uri):
        return S3Store(endpoint_url)
    if "://" in uri and not uri.startswith("file://"):
        raise StoreError(f"unsupported URI scheme in {uri!r}: use a local path, file:// or s3://")
    return LocalStore()
