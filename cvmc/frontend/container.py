"""NNEF model containers (spec 5.1): a graph.nnef, its .dat weights and an optional graph.quant.

A model is a `.nnef` file (weights in its folder), a folder holding `graph.nnef`, or a
`.tar` / `.tar.gz` / `.tgz` archive of such a folder. Archives are read in place (never
extracted) and hold only regular files and folders; every header is checked first, then
only the graph files and the .dat members the graph names are read, each bounded before it
is decompressed (graph files by MAX_TEXT_BYTES, a .dat by its variable's declared shape).
Nothing cvmc finds in a model folder by name (weights, graph.nnef, graph.quant,
quantization.json) reaches outside it.
"""
from __future__ import annotations

import contextlib
import lzma
import os
import posixpath
import re
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self

import numpy as np

from cvmc.errors import CvmcError, SourceSpan
from cvmc.frontend.syntax import normalize_text
from cvmc.frontend.tensorfile import read_tensor_bytes

GRAPH_FILE = "graph.nnef"
QUANT_FILE = "graph.quant"
QUANTIZATION_FILE = "quantization.json"
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
# Sum of member sizes, checked header by header as the archive is read: a hostile archive
# (a small .tgz of a huge member, a sparse tar) fails at the first header past the bound,
# before its data is decompressed or held. 1 GiB is 10x the int32 weights of ResNet-50.
MAX_ARCHIVE_BYTES = 1 << 30
MAX_ARCHIVE_MEMBERS = 100_000
# A graph.nnef or graph.quant: ResNet-50's graph is 60 KiB; 64 MiB is text no one writes.
MAX_TEXT_BYTES = 64 << 20
TEXT_BOUND = "a graph or quantization file may hold"
# A .dat file is bounded by its variable's declared shape: the header, then at most 64
# bits per element (the widest item type a tensor file holds).
DAT_BOUND = "its variable's declared shape allows (128-byte header, <= 8 bytes an item)"


@dataclass
class ModelSource:
    """The text of a model's graph and quantization files, and access to its weights.

    Use it as a context manager: an archive stays open while its weights are read.
    """

    graph_text: str
    graph_name: str  # shown in error messages, e.g. "model.tgz:graph.nnef"
    quant_text: str | None
    quant_name: str | None
    # ("<label>.dat", byte bound) -> bytes, or None when there is no such file
    fetch: Callable[[str, int], bytes | None] = field(repr=False)
    where: str = ""  # prefix naming the model folder in error messages
    position: Callable[[str], int] = field(default=lambda rel: 0, repr=False)  # in archive
    close: Callable[[], None] = field(default=lambda: None, repr=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def storage_order(self, labels: Iterable[str]) -> list[str]:
        """`labels` in the order their files are stored: reading them so never goes back
        in a compressed archive (which would decompress it again from its start)."""
        return sorted(labels, key=lambda label: self.position(label + ".dat"))

    def read_tensor(self, label: str, max_bytes: int) -> np.ndarray | None:
        """The weight stored under `label` (`<label>.dat`), or None when there is no file;
        a file larger than `max_bytes` is an error, raised before its data is read."""
        check_label(label)
        data = self.fetch(label + ".dat", max_bytes)
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


def _bounded(size: int, limit: int, name: str, bound: str) -> None:
    """Refuse a file of `size` bytes over `limit` (`bound` says why that is the limit)."""
    if size > limit:
        raise CvmcError(f"{name}: {size} bytes, more than the {limit} bytes {bound}")


def _read_bounded(stream: IO[bytes], limit: int, name: str, bound: str) -> bytes:
    """At most `limit` bytes of a stream; a longer one is an error (one byte more is read:
    a file's size can change after it was checked, or be unknown)."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise CvmcError(f"{name}: more than the {limit} bytes {bound}")
    return data


def _read_file(path: Path, what: str, limit: int, bound: str) -> bytes:
    try:
        with path.open("rb") as stream:
            return _read_bounded(stream, limit, str(path), bound)
    except OSError as e:
        raise CvmcError(f"{path}: cannot read {what}: {e.strerror}") from None


def file_in_folder(root: Path, rel: str, what: str) -> Path | None:
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

    def fetch(rel: str, limit: int) -> bytes | None:
        path = file_in_folder(root, rel, "weight file")
        return None if path is None else _read_file(path, "weights", limit, DAT_BOUND)

    beside = file_in_folder(root, QUANT_FILE, "quantization file") if quant is None else None
    quant_text, quant_name = _read_quant(quant if quant is not None else beside)
    return ModelSource(
        graph_text=_decode(_read_file(graph, "graph", MAX_TEXT_BYTES, TEXT_BOUND), str(graph)),
        graph_name=str(graph),
        quant_text=quant_text, quant_name=quant_name, fetch=fetch, where=f"{graph.parent}/")


def _read_quant(path: Path | None) -> tuple[str | None, str | None]:
    """(text, name) of a quantization file on disk, or (None, None) without one."""
    if path is None:
        return None, None
    text = _read_file(path, "quantization file", MAX_TEXT_BYTES, TEXT_BOUND)
    return _decode(text, str(path)), str(path)


@contextlib.contextmanager
def _tar_errors(path: Path) -> Iterator[None]:
    """A damaged archive is one CvmcError naming it."""
    try:
        yield
    # zlib / lzma errors: a damaged compressed stream (bz2 reports an OSError)
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as e:
        raise CvmcError(f"{path}: not a readable tar archive ({e})") from None


def _is_graph_file(name: str) -> bool:
    """A graph.nnef / graph.quant where a model's can be: at the top or one folder down."""
    return posixpath.basename(name) in (GRAPH_FILE, QUANT_FILE) and name.count("/") <= 1


def _scan_tar(path: Path, tar: tarfile.TarFile) -> tuple[dict[str, tarfile.TarInfo],
                                                          dict[str, bytes]]:
    """Every regular file of an archive by normalized name, and the bytes of its graph
    files, read as they pass. Each header is checked (type, name, running size, count)
    before anything else; no other member's data is read here."""
    infos: dict[str, tarfile.TarInfo] = {}
    texts: dict[str, bytes] = {}
    total = 0
    for count, info in enumerate(tar, start=1):
        if count > MAX_ARCHIVE_MEMBERS:
            raise CvmcError(f"{path}: archive has more than {MAX_ARCHIVE_MEMBERS} members")
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
        if name in infos:
            raise CvmcError(f"{path}: archive holds '{name}' twice; which one is meant "
                            f"is ambiguous")
        infos[name] = info
        if _is_graph_file(name):
            texts[name] = _read_member(path, tar, info, name, MAX_TEXT_BYTES, TEXT_BOUND)
    return infos, texts


def _read_member(path: Path, tar: tarfile.TarFile, info: tarfile.TarInfo, name: str,
                 limit: int, bound: str) -> bytes:
    """A member's bytes, its size checked against `limit` before they are decompressed."""
    _bounded(info.size, limit, f"{path.name}:{name}", bound)
    with _tar_errors(path):
        return tar.extractfile(info).read()  # type: ignore[union-attr]


def _member_name(path: Path, info: tarfile.TarInfo) -> str:
    name = posixpath.normpath(info.name)
    if name.startswith(("/", "../")) or name == "..":
        raise CvmcError(f"{path}: archive member '{info.name}' lies outside the archive")
    return name


def _graph_member(path: Path, infos: dict[str, tarfile.TarInfo]) -> str:
    """The one graph.nnef at the top of the archive or in a single top-level folder."""
    found = [n for n in infos if posixpath.basename(n) == GRAPH_FILE and n.count("/") <= 1]
    if len(found) != 1:
        raise CvmcError(f"{path}: expected one {GRAPH_FILE} at the top of the archive or in "
                        f"one top-level folder, found {len(found)}")
    return found[0]


def _open_tar(path: Path, quant: Path | None) -> ModelSource:
    """A model in an archive, kept open: its weights are read when the graph names them."""
    with contextlib.ExitStack() as on_error:
        with _tar_errors(path):
            tar = on_error.enter_context(tarfile.open(path, "r:*"))
        source = _tar_source(path, tar, quant)
        on_error.pop_all()  # success: the ModelSource closes the archive
        return source


def _tar_source(path: Path, tar: tarfile.TarFile, quant: Path | None) -> ModelSource:
    with _tar_errors(path):
        infos, texts = _scan_tar(path, tar)
    graph = _graph_member(path, infos)
    folder = posixpath.dirname(graph)

    def member(rel: str) -> str:
        return posixpath.join(folder, rel) if folder else rel

    def fetch(rel: str, limit: int) -> bytes | None:
        info = infos.get(member(rel))
        return None if info is None else _read_member(path, tar, info, member(rel), limit,
                                                      DAT_BOUND)

    def position(rel: str) -> int:
        info = infos.get(member(rel))
        return -1 if info is None else info.offset_data

    quant_text, quant_label = _read_quant(quant)
    if quant is None and member(QUANT_FILE) in texts:
        quant_label = f"{path.name}:{member(QUANT_FILE)}"
        quant_text = _decode(texts[member(QUANT_FILE)], quant_label)
    graph_name = f"{path.name}:{graph}"
    return ModelSource(graph_text=_decode(texts[graph], graph_name), graph_name=graph_name,
                       quant_text=quant_text, quant_name=quant_label, fetch=fetch,
                       where=f"{path.name}:{member('')}", position=position, close=tar.close)


def quantization_file(model: str | os.PathLike) -> Path | None:
    """The quantization.json (`cvmc quantize`'s scales) in a model folder or beside its
    `.nnef` graph file, inside that folder as every file cvmc finds by name (a link that
    leaves it is an error); None if there is none (archives and CVM-Runtime JSON hold
    none)."""
    model = Path(model)
    folder = model if model.is_dir() else model.parent if model.suffix == ".nnef" else None
    return None if folder is None else \
        file_in_folder(folder.resolve(), QUANTIZATION_FILE, "quantization file")


def open_model(path: Path, quant: Path | None = None) -> ModelSource:
    """Open an NNEF model: a .nnef file, a folder with graph.nnef, or a .tar/.tar.gz/.tgz."""
    path = Path(path)
    if path.is_dir():
        graph = file_in_folder(path.resolve(), GRAPH_FILE, "graph file")
        if graph is None:
            raise CvmcError(f"{path}: model folder has no {GRAPH_FILE}")
        return _open_folder(graph, quant)
    if not path.is_file():
        raise CvmcError(f"{path}: no such file or folder")
    if path.name.endswith(TAR_SUFFIXES):
        return _open_tar(path, quant)
    return _open_folder(path, quant)
