"""The per-user kernel cache: one compiled object file per CPU kernel, keyed by what
decides its bytes, so recompiling a model rebuilds only the kernels that changed; and the
backend shim's object, the same for every model (`cvmc.codegen.build`).

Where: `$CVMC_CACHE_DIR` when set (set but empty: no cache), else
`$XDG_CACHE_HOME/cvmc/kernels`, else `~/.cache/cvmc/kernels`. The folder is not bounded
in size (an entry is the kernel's object file, 5-50 KB; ResNet-18 takes about 1 MB):
delete it, or any file in it, at any time.

An entry is written to a temporary file in the folder and renamed into place, so a
reader sees a whole entry or none; one that is truncated or corrupt anyway (a full disk,
an edit) fails its checksum, is ignored and rebuilt.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "CVMC_CACHE_DIR"
MAGIC = b"cvmc-kernel-1\n"
_HEADER = struct.Struct("<I")  # length of the JSON header that follows MAGIC


def cache_folder() -> Path | None:
    """The kernel cache's folder by the environment (module docstring), or None when
    `CVMC_CACHE_DIR` is set empty."""
    if CACHE_ENV in os.environ:
        value = os.environ[CACHE_ENV]
        return Path(value).expanduser() if value else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cvmc" / "kernels"


@functools.cache
def _versions() -> str:
    """cvmc's and TVM's versions and a digest of the schedule code (cvmc/lowering): an
    edited schedule rule must miss the cache even where the version number is the same."""
    from importlib.metadata import version

    import tvm

    import cvmc.lowering

    digest = hashlib.sha256()
    for path in sorted(Path(cvmc.lowering.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"cvmc {version('cvmc')}; tvm {tvm.__version__}; rules {digest.hexdigest()}"


def kernel_key(script: str, built_for: dict) -> str:
    """The cache key of a kernel: sha256 of its unscheduled TIR (`script`, which names its
    symbol), the target it is built for (`built_for`: kind, mcpu and LLVM features) and
    `_versions()`."""
    text = "\0".join([script, json.dumps(built_for, sort_keys=True), _versions()])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class KernelObject:
    """A kernel compiled to an object file, and the schedule rule it got."""

    obj: bytes
    rule: str


class KernelCache:
    """Kernel objects stored in `folder` by key (`kernel_key`)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / key

    def load(self, key: str) -> KernelObject | None:
        """The entry of `key`, or None when there is none or it does not read back whole."""
        try:
            data = self._path(key).read_bytes()
        except OSError:
            return None
        start = len(MAGIC) + _HEADER.size
        if len(data) < start or not data.startswith(MAGIC):
            return None
        (size,) = _HEADER.unpack_from(data, len(MAGIC))
        try:
            header = json.loads(data[start:start + size])
            obj = data[start + size:]
            if hashlib.sha256(obj).hexdigest() != header["sha256"]:
                return None
            return KernelObject(obj, header["rule"])
        except (ValueError, KeyError, TypeError):
            return None

    def store(self, key: str, kernel: KernelObject) -> None:
        """Write the entry of `key` atomically; a cache that cannot be written (read-only,
        full) only costs the next compile its time, so the error is dropped."""
        header = json.dumps({"rule": kernel.rule,
                             "sha256": hashlib.sha256(kernel.obj).hexdigest()}).encode()
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(MAGIC + _HEADER.pack(len(header)) + header + kernel.obj)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass
