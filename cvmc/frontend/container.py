"""NNEF model containers (spec 5.1): a graph.nnef, its .dat weights and an optional graph.quant.

A model is a `.nnef` file (weights in its folder), a folder holding `graph.nnef`, or a
`.tar` / `.tar.gz` / `.tgz` archive of such a folder. Archives are read in memory (never
extracted), hold only regular files and folders, and are bounded in total size. A weight
label never reaches outside the model folder.
"""
from __future__ import annotations

import lzma
import posixpath
import re
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cvmc.errors import CvmcError, SourceSpan
from cvmc.frontend.syntax import normalize_text
from cvmc.frontend.tensorfile import read_tensor_bytes

GRAPH_FILE = "graph.nnef"
QUANT_FILE = "graph.quant"
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
# Sum of member sizes, checked header by header as the archive is read: a hostile archive
# (a small .tgz of a huge member, a sparse tar) fails at the first header past the bound,
# before its data is decompressed or held. 1 GiB is 10x the int32 weights of ResNet-50.
MAX_ARCHIVE_BYTES = 1 << 30
MAX_ARCHIVE_MEMBERS = 100_000


@dataclass
class ModelSource:
    """The text of a model's graph and quantization files, and access to its weights."""

    graph_text: str
    graph_name: str  # shown in error messages, e.g. "model.tgz:graph.nnef"
    quant_text: str | None
    quant_name: str | None
    fetch: Callable[[str], bytes | None] = field(repr=False)  # "<label>.dat" -> bytes or None
    where: str = ""  # prefix naming the model folder in error messages

    def read_tensor(self, label: str) -> np.ndarray | None:
        """The weight stored under `label` (`<label>.dat`), or None when there is no file."""
        check_label(label)
        data = self.fetch(label + ".dat")
        return None if data is None else read_tensor_bytes(data, f"{self.where}{label}.dat")


def check_label(label: str) -> None:
    """Reject a weight label that could name a file outside the model folder."""
    bad = ("is empty" if not label else
           "contains a NUL character" if "\0" in label else
           "contains a backslash" if "\\" in label else
           "is an absolute path" if label.startswith("/") else
           "has an empty, '.' or '..' path component"
           if any(part in ("", ".", "..") for part in label.split("/")) else
           "has characters other than letters, digits, '_', '-', '.' and '/' (NNEF 4.1.3)"
           if not re.fullmatch(r"[A-Za-z0-9_./-]+", label) else None)
    if bad:
        raise CvmcError(f"variable label {label!r} {bad}: labels are relative paths inside "
                        f"the model folder, like 'conv1/filter'")


def _decode(data: bytes, name: str) -> str:
    """UTF-8 text of a model file, or a CvmcError locating the first bad byte by line and
    column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = normalize_text(data[:e.start].decode("utf-8"))
        line = before.count("\n") + 1
        col = len(before) - before.rfind("\n")
        raise CvmcError(f"not UTF-8 text (byte 0x{data[e.start]:02x})",
                        SourceSpan(name, line, col)) from None


def _read_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise CvmcError(f"{path}: cannot read {what}: {e.strerror}") from None


def _inside(root: Path, rel: str, what: str) -> Path | None:
    """`root/rel` resolved, if it is a file inside `root` (None if there is no file).

    Every file cvmc finds in a model folder by name (weights, graph.quant, the graph of a
    folder) must stay inside it, symlinks included; the user's own paths may go anywhere.
    """
    try:
        path = (root / rel).resolve()
        if not path.is_relative_to(root):
            raise CvmcError(f"{what} '{root / rel}' resolves outside the model folder")
        return path if path.is_file() else None
    except (OSError, RuntimeError) as e:  # a name too long, a symlink loop
        raise CvmcError(f"{what} '{rel[:200]}': cannot be opened in the model folder "
                        f"({getattr(e, 'strerror', None) or e})") from None


def _open_folder(graph: Path, quant: Path | None) -> ModelSource:
    """A model whose weights lie in the folder of `graph`."""
    root = graph.parent.resolve()

    def fetch(rel: str) -> bytes | None:
        path = _inside(root, rel, "weight file")
        return None if path is None else _read_file(path, "weights")

    beside = _inside(root, QUANT_FILE, "quantization file") if quant is None else None
    quant_text, quant_name = _read_quant(quant if quant is not None else beside)
    return ModelSource(
        graph_text=_decode(_read_file(graph, "graph"), str(graph)), graph_name=str(graph),
        quant_text=quant_text, quant_name=quant_name, fetch=fetch, where=f"{graph.parent}/")


def _read_quant(path: Path | None) -> tuple[str | None, str | None]:
    """(text, name) of a quantization file on disk, or (None, None) without one."""
    if path is None:
        return None, None
    return _decode(_read_file(path, "quantization file"), str(path)), str(path)


def _tar_members(path: Path) -> dict[str, bytes]:
    """The regular files of an archive that a model can use (graph.nnef, graph.quant,
    *.dat), by normalized name, read in memory; every header is checked (type, name,
    running size, count) before any data is read."""
    members: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(path, "r:*") as tar:
            for count, info in enumerate(tar, start=1):
                if count > MAX_ARCHIVE_MEMBERS:
                    raise CvmcError(f"{path}: archive has more than {MAX_ARCHIVE_MEMBERS} "
                                    f"members")
                if info.isdir():
                    continue
                if not info.isfile() or info.issparse():
                    kind = "sparse file" if info.isfile() else "link or special file"
                    raise CvmcError(f"{path}: archive member '{info.name}' is a {kind}; only "
                                    f"regular files and folders are allowed")
                total += info.size
                if total > MAX_ARCHIVE_BYTES:
                    raise CvmcError(f"{path}: archive members exceed {MAX_ARCHIVE_BYTES} bytes "
                                    f"(at member '{info.name}', {info.size} bytes)")
                name = _member_name(path, info)
                if name in members:
                    raise CvmcError(f"{path}: archive holds '{name}' twice; which one is meant "
                                    f"is ambiguous")
                if name.endswith(".dat") or posixpath.basename(name) in (GRAPH_FILE,
                                                                          QUANT_FILE):
                    members[name] = tar.extractfile(info).read()  # type: ignore[union-attr]
                else:  # nothing a model can name: never read (only its header was checked)
                    members[name] = b""
    # zlib / lzma errors: a damaged compressed stream (bz2 reports an OSError)
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as e:
        raise CvmcError(f"{path}: not a readable tar archive ({e})") from None
    return members


def _member_name(path: Path, info: tarfile.TarInfo) -> str:
    name = posixpath.normpath(info.name)
    if name.startswith(("/", "../")) or name == "..":
        raise CvmcError(f"{path}: archive member '{info.name}' lies outside the archive")
    return name


def _graph_member(path: Path, members: dict[str, bytes]) -> str:
    """The one graph.nnef at the top of the archive or in a single top-level folder."""
    found = [n for n in members if posixpath.basename(n) == GRAPH_FILE and n.count("/") <= 1]
    if len(found) != 1:
        raise CvmcError(f"{path}: expected one {GRAPH_FILE} at the top of the archive or in "
                        f"one top-level folder, found {len(found)}")
    return found[0]


def _open_tar(path: Path, quant: Path | None) -> ModelSource:
    members = _tar_members(path)
    graph = _graph_member(path, members)
    folder = posixpath.dirname(graph)

    def member(rel: str) -> str:
        return posixpath.join(folder, rel) if folder else rel

    def fetch(rel: str) -> bytes | None:
        return members.get(member(rel))

    quant_text, quant_label = _read_quant(quant)
    if quant is None and member(QUANT_FILE) in members:
        quant_label = f"{path.name}:{member(QUANT_FILE)}"
        quant_text = _decode(members[member(QUANT_FILE)], quant_label)
    graph_name = f"{path.name}:{graph}"
    return ModelSource(graph_text=_decode(members[graph], graph_name), graph_name=graph_name,
                       quant_text=quant_text, quant_name=quant_label, fetch=fetch,
                       where=f"{path.name}:{member('')}")


def open_model(path: Path, quant: Path | None = None) -> ModelSource:
    """Open an NNEF model: a .nnef file, a folder with graph.nnef, or a .tar/.tar.gz/.tgz."""
    path = Path(path)
    if path.is_dir():
        graph = _inside(path.resolve(), GRAPH_FILE, "graph file")
        if graph is None:
            raise CvmcError(f"{path}: model folder has no {GRAPH_FILE}")
        return _open_folder(graph, quant)
    if not path.is_file():
        raise CvmcError(f"{path}: no such file or folder")
    if path.name.endswith(TAR_SUFFIXES):
        return _open_tar(path, quant)
    return _open_folder(path, quant)
