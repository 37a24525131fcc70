"""The per-user kernel cache: one compiled object file per CPU kernel, keyed by what
decides its bytes, so recompiling a model rebuilds only the kernels that changed
(`cvmc.codegen.build`).

Where: `$CVMC_CACHE_DIR` when set (set but empty: no cache), else
`$XDG_CACHE_HOME/cvmc/kernels`, else `~/.cache/cvmc/kernels`. The folder is not bounded
in size (an entry is the kernel's object file, 5-50 KB; ResNet-18 takes about 1 MB):
delete it, or any file in it, at any time.

Trust model. The folder belongs to the user, as their models and their Python do: cvmc
does not defend against someone who may write there on purpose (they could as well
edit cvmc). It defends against every entry that is not what a compile asks for: an
entry damaged (a full disk, an edit), copied from another model or cache, left by
another cvmc, TVM or LLVM, or built for another CPU (`--mcpu`). An entry proves what it
is: its header holds its full key (`entry_key`: kind, the symbols it defines, sha256 of
its source, the target, CPU and LLVM features it was built for, the versions of cvmc,
TVM, LLVM and the schedules), the schedule rule it got and its object's sha256. `load` uses an entry only when that
key is the one asked for, field by field, its rule is one the caller knows, the object
matches its checksum and defines the functions the key names and no other global
symbol (so it links beside the others); any other entry is ignored, rebuilt and
overwritten. The file's name (a digest of the key) only finds the entry; it proves
nothing.

An entry is written to a temporary file in the folder and renamed into place, so a
reader sees a whole entry or none, and compiles sharing the folder at the same time
each read whole entries (the same kernel built twice at once is the same bytes: the
last rename wins).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "CVMC_CACHE_DIR"
MAGIC = b"cvmc-kernel-2\n"
_HEADER = struct.Struct("<I")  # length of the JSON header that follows MAGIC
# ELF64: a section header, a symbol, the symbol table's section type, a global binding
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_SHT_SYMTAB, _STB_GLOBAL = 2, 1


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
    """cvmc's, TVM's and LLVM's versions and a digest of the schedule code (cvmc/lowering):
    an edited schedule rule must miss the cache even where the version number is the
    same."""
    from importlib.metadata import version

    import tvm
    from tvm.target import codegen

    import cvmc.lowering

    digest = hashlib.sha256()
    for path in sorted(Path(cvmc.lowering.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return (f"cvmc {version('cvmc')}; tvm {tvm.__version__}; "
            f"llvm {codegen.llvm_version_major()}; rules {digest.hexdigest()}")


def entry_key(kind: str, symbols: Collection[str], source: str, built_for: dict) -> str:
    """The full key of an entry, as canonical JSON: its `kind` ("kernel"), the `symbols`
    its object defines, sha256 of its `source` (a kernel's unscheduled TIR), what it is
    `built_for` (kind, mcpu and LLVM features) and `_versions()`."""
    return json.dumps({"kind": kind, "symbols": sorted(symbols),
                       "source": hashlib.sha256(source.encode()).hexdigest(),
                       "built_for": built_for, "versions": _versions()}, sort_keys=True)


def exported_symbols(obj: bytes) -> set[str]:
    """The global symbols an ELF64 little-endian object file defines (weak and local ones
    aside): what it adds to a library, and could define twice there. A ValueError,
    struct.error or IndexError when it is not such a file."""
    if obj[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not an ELF64 little-endian object")
    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    (shnum,) = struct.unpack_from("<H", obj, 0x3C)
    sections = [_SECTION.unpack_from(obj, shoff + i * _SECTION.size) for i in range(shnum)]
    found = set()
    for _, kind, _, _, offset, size, link, *_ in sections:
        if kind != _SHT_SYMTAB:
            continue
        names = sections[link][4]  # the string table's offset
        for i in range(offset, offset + size, _SYMBOL.size):
            name, info, _, shndx, _, _ = _SYMBOL.unpack_from(obj, i)
            if info >> 4 == _STB_GLOBAL and shndx != 0:  # defined here, not weak
                found.add(obj[names + name:obj.index(b"\0", names + name)].decode())
    return found


@dataclass(frozen=True)
class KernelObject:
    """A kernel compiled to an object file, and the schedule rule it got."""

    obj: bytes
    rule: str


class KernelCache:
    """Entries stored in `folder` by their key (`entry_key`)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _path(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.folder / digest[:2] / digest

    def load(self, key: str, rules: Collection[str]) -> KernelObject | None:
        """The entry of `key`, or None when there is none or it is not exactly that: its
        header must hold `key` itself and a rule among `rules`, and its object must match
        the header's checksum and define (strongly) the functions of the key's symbols
        and no other (module docstring)."""
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
            if (header["key"] != key or header["rule"] not in rules
                    or hashlib.sha256(obj).hexdigest() != header["sha256"]
                    or exported_symbols(obj) != set(json.loads(key)["symbols"])):
                return None
            return KernelObject(obj, header["rule"])
        except (ValueError, KeyError, TypeError, IndexError, struct.error):
            return None

    def store(self, key: str, kernel: KernelObject) -> None:
        """Write the entry of `key` atomically; a cache that cannot be written (read-only,
        full) only costs the next compile its time, so the error is dropped."""
        header = json.dumps({"key": key, "rule": kernel.rule,
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
