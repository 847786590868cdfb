"""The tuning cache: launch configurations the tiler measured, keyed by what decides them.

Key: template, the kernel's geometry (shapes), element type, GPU model, plus a short hash of
the kernel's code (so a kernel with other ops inside does not reuse a config measured for
another) and the Triton version (a new compiler may change the winner). A second run of the
same problem on the same GPU finds every kernel's config here and spends no search time.

One JSON file (``Settings.tuning_cache``, default ``~/.cache/egg/tuning.json``), shared by
processes: every update takes an exclusive lock on ``<file>.lock``, re-reads the file, merges
and replaces it atomically (write to a temp file in the same folder, then ``os.replace``), so
concurrent writers never lose each other's entries and readers never see half a file.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import tempfile
import time
from typing import Any

VERSION = 1


def default_path() -> pathlib.Path:
    return pathlib.Path.home() / ".cache" / "egg" / "tuning.json"


def resolve_path(setting: str) -> pathlib.Path | None:
    """The cache file for a Settings.tuning_cache value; None when the cache is off."""
    s = (setting or "").strip()
    if s.lower() in ("off", "none", "0", "false", "no"):
        return None
    return pathlib.Path(s).expanduser() if s else default_path()


def make_key(template: str, shapes: dict | list | tuple, dtype: str, gpu: str, code: str = "",
             extra: dict | None = None) -> str:
    """A stable, readable key: 'template|dtype|gpu|shapes-json|code-hash|triton-version'."""
    try:
        import triton

        tv = triton.__version__
    except Exception:  # noqa: BLE001
        tv = "?"
    sh = json.dumps(shapes, sort_keys=True, separators=(",", ":"), default=str)
    ch = hashlib.sha256(code.encode()).hexdigest()[:12] if code else "-"
    parts = [template, dtype, gpu, sh, ch, f"triton-{tv}"]
    if extra:
        parts.append(json.dumps(extra, sort_keys=True, separators=(",", ":"), default=str))
    return "|".join(parts)


@contextlib.contextmanager
def _locked(path: pathlib.Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "a+") as lk:
        fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lk.fileno(), fcntl.LOCK_UN)


class TuningCache:
    def __init__(self, path: str | os.PathLike | None):
        self.path = pathlib.Path(path) if path is not None else None

    @classmethod
    def from_settings(cls, settings) -> "TuningCache":
        return cls(resolve_path(getattr(settings, "tuning_cache", "")))

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _read(self) -> dict:
        if self.path is None or not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            return {}  # a damaged cache is an empty one; the next write replaces it
        if doc.get("version") != VERSION:
            return {}
        return doc.get("entries", {})

    def entries(self) -> dict[str, dict]:
        return self._read()

    def get(self, key: str) -> dict | None:
        """The entry of a key ({'config': {...}, 'ms': ..., ...}) or None."""
        if self.path is None:
            return None
        e = self._read().get(key)
        return e if isinstance(e, dict) and isinstance(e.get("config"), dict) else None

    def drop(self, keys) -> None:
        """Remove entries (e.g. a cached config whose candidate failed verification)."""
        keys = set(keys)
        if self.path is None or not keys:
            return
        self._update(lambda entries: [entries.pop(k, None) for k in keys])

    def put(self, key: str, config: dict, **info: Any) -> None:
        self.put_many({key: {"config": config, **info}})

    def put_many(self, items: dict[str, dict]) -> None:
        """Merge entries into the file under the lock, replacing it atomically."""
        if self.path is None or not items:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        self._update(lambda entries: entries.update({k: {**v, "when": now} for k, v in items.items()}))

    def _update(self, change) -> None:
        """Read, change and atomically replace the file, all under the lock."""
        with _locked(self.path):
            entries = self._read()
            change(entries)
            data = json.dumps({"version": VERSION, "entries": entries}, indent=1, sort_keys=True,
                              default=str)
            fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".json", dir=str(self.path.parent))
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
