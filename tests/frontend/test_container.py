"""NNEF containers: .nnef files, folders, tar archives; label escapes; hostile archives."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from cvmc.errors import CvmcError
from cvmc.frontend.container import check_label, open_model
from cvmc.frontend.tensorfile import tensor_bytes

GRAPH = "version 1.0;\ngraph g( x ) -> ( y ) { y = relu(x); }\n"
QUANT = '"y": cvm_precision_spec(precision = 8);\n'
FILTER = np.arange(-4, 4, dtype=np.int8).reshape(2, 4)
LIMIT = 1 << 20  # bytes a .dat may hold in these tests


def _folder(root: Path, quant: bool = True) -> Path:
    (root / "conv1").mkdir(parents=True)
    (root / "graph.nnef").write_text(GRAPH)
    (root / "conv1" / "filter.dat").write_bytes(tensor_bytes(FILTER))
    if quant:
        (root / "graph.quant").write_text(QUANT)
    return root


def _tar(path: Path, files: dict[str, bytes], mode: str = "w:gz",
         extra: list[tarfile.TarInfo] = ()) -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return path


def _model_files(prefix: str = "") -> dict[str, bytes]:
    return {f"{prefix}graph.nnef": GRAPH.encode(), f"{prefix}graph.quant": QUANT.encode(),
            f"{prefix}conv1/filter.dat": tensor_bytes(FILTER)}


def _check(src, graph_name: str, quant_name: str | None) -> None:
    assert src.graph_text == GRAPH and src.graph_name == graph_name
    assert src.quant_name == quant_name
    assert src.quant_text == (QUANT if quant_name else None)
    assert np.array_equal(src.read_tensor("conv1/filter", LIMIT), FILTER)
    assert src.read_tensor("conv1/bias", LIMIT) is None


def test_folder_and_nnef_file(tmp_path: Path) -> None:
    root = _folder(tmp_path / "m")
    _check(open_model(root), str(root / "graph.nnef"), str(root / "graph.quant"))
    _check(open_model(root / "graph.nnef"), str(root / "graph.nnef"), str(root / "graph.quant"))


def test_quant_argument_overrides_and_absent_quant(tmp_path: Path) -> None:
    root = _folder(tmp_path / "m", quant=False)
    _check(open_model(root), str(root / "graph.nnef"), None)
    other = tmp_path / "other.quant"
    other.write_text(QUANT)
    _check(open_model(root, other), str(root / "graph.nnef"), str(other))
    with pytest.raises(CvmcError, match="cannot read quantization file"):
        open_model(root, tmp_path / "missing.quant")


@pytest.mark.parametrize("name,mode,prefix", [("m.tgz", "w:gz", ""), ("m.tar", "w", "./"),
                                              ("m.tar.gz", "w:gz", "model/")])
def test_tar_containers(tmp_path: Path, name: str, mode: str, prefix: str) -> None:
    path = _tar(tmp_path / name, _model_files(prefix), mode)
    member = prefix.removeprefix("./")
    _check(open_model(path), f"{name}:{member}graph.nnef", f"{name}:{member}graph.quant")


def test_tar_without_graph_or_with_two(tmp_path: Path) -> None:
    with pytest.raises(CvmcError, match="found 0"):
        open_model(_tar(tmp_path / "a.tgz", {"x/y/graph.nnef": b""}))
    files = {**_model_files("a/"), **_model_files("b/")}
    with pytest.raises(CvmcError, match="found 2"):
        open_model(_tar(tmp_path / "b.tgz", files))


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                                  tarfile.FIFOTYPE])
def test_tar_links_and_devices_rejected(tmp_path: Path, kind: bytes) -> None:
    link = tarfile.TarInfo("conv1/bias.dat")
    link.type, link.linkname = kind, "/etc/passwd"
    path = _tar(tmp_path / "m.tgz", _model_files(), extra=[link])
    with pytest.raises(CvmcError, match="'conv1/bias.dat' is a link or special file"):
        open_model(path)


def test_tar_member_outside_archive_rejected(tmp_path: Path) -> None:
    path = _tar(tmp_path / "m.tar", {**_model_files(), "../evil.dat": b"x"}, "w")
    with pytest.raises(CvmcError, match="outside the archive"):
        open_model(path)


def test_tar_total_size_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cvmc.frontend import container
    monkeypatch.setattr(container, "MAX_ARCHIVE_BYTES", 100)
    with pytest.raises(CvmcError, match="members exceed 100 bytes"):
        open_model(_tar(tmp_path / "m.tgz", _model_files()))


def test_corrupt_tar_and_missing_paths(tmp_path: Path) -> None:
    (tmp_path / "bad.tgz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(CvmcError, match="not a readable tar archive"):
        open_model(tmp_path / "bad.tgz")
    with pytest.raises(CvmcError, match="no such file"):
        open_model(tmp_path / "nothing.nnef")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CvmcError, match="has no graph.nnef"):
        open_model(tmp_path / "empty")


def test_non_utf8_graph(tmp_path: Path) -> None:
    (tmp_path / "g.nnef").write_bytes(b"version 1.0;\n\xff\xfe")
    with pytest.raises(CvmcError) as e:
        open_model(tmp_path / "g.nnef")
    assert str(e.value).endswith("g.nnef:2:1: error: not UTF-8 text (byte 0xff)")
    # Lines count CR LF and a lone CR as one break each; columns count characters.
    (tmp_path / "g.nnef").write_bytes("version 1.0;\r\ngraph\rG é\xff".encode()[:-2] + b"\xff")
    with pytest.raises(CvmcError) as e:
        open_model(tmp_path / "g.nnef")
    assert "g.nnef:3:4: error: not UTF-8 text (byte 0xff)" in str(e.value)


@pytest.mark.parametrize("label", ["", "../secret", "a/../../b", "/etc/passwd", "a\\b",
                                   "a//b", "a/", "./a", "a\0b"])
def test_escaping_labels_rejected(label: str, tmp_path: Path) -> None:
    with pytest.raises(CvmcError, match="variable label"):
        check_label(label)
    src = open_model(_folder(tmp_path / "m"))
    with pytest.raises(CvmcError, match="variable label"):
        src.read_tensor(label, LIMIT)


def test_symlink_in_folder_leading_outside_rejected(tmp_path: Path) -> None:
    root = _folder(tmp_path / "m")
    (tmp_path / "outside.dat").write_bytes(tensor_bytes(FILTER))
    (root / "w.dat").symlink_to(tmp_path / "outside.dat")
    with pytest.raises(CvmcError, match="outside the model folder"):
        open_model(root).read_tensor("w", LIMIT)


def test_corrupt_weight_names_the_member(tmp_path: Path) -> None:
    files = {**_model_files("model/"), "model/conv1/filter.dat": b"junk"}
    src = open_model(_tar(tmp_path / "m.tgz", files))
    with pytest.raises(CvmcError, match=r"m\.tgz:model/conv1/filter\.dat"):
        src.read_tensor("conv1/filter", LIMIT)


# ---- issue 9, items 5, 7, 10, 12: what a model folder or archive may make cvmc read --------
def test_graph_and_quant_symlinks_must_stay_inside_the_folder(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:SECRET\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "graph.nnef").symlink_to(secret)
    with pytest.raises(CvmcError) as e:
        open_model(model)
    assert "resolves outside the model folder" in str(e.value) and "SECRET" not in str(e.value)
    (model / "graph.nnef").unlink()
    (model / "graph.nnef").write_text(GRAPH)
    (model / "graph.quant").symlink_to(secret)
    with pytest.raises(CvmcError, match="quantization file .* resolves outside"):
        open_model(model)


@pytest.mark.parametrize("label", ["a" * 5000, "/".join(["d"] * 3000), "loop/x"])
def test_unopenable_labels_are_one_error(tmp_path: Path, label: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "graph.nnef").write_text(GRAPH)
    (model / "loop").symlink_to(model / "loop")
    with pytest.raises(CvmcError, match="cannot be opened in the model folder"):
        open_model(model).read_tensor(label, LIMIT)


def test_archive_bomb_fails_at_its_header(tmp_path: Path) -> None:
    """A small .tgz whose header claims a 2 GiB member fails before any data is read."""
    info = tarfile.TarInfo("graph.nnef")
    info.size = 2 << 30
    raw = io.BytesIO()
    raw.write(info.tobuf())  # the header alone: the data would follow
    import gzip
    (tmp_path / "bomb.tgz").write_bytes(gzip.compress(raw.getvalue()))
    with pytest.raises(CvmcError, match="members exceed"):
        open_model(tmp_path / "bomb.tgz")


def test_duplicate_archive_members_are_ambiguous(tmp_path: Path) -> None:
    path = tmp_path / "m.tar"
    _tar(path, _model_files(), mode="w")
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("graph.nnef")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(CvmcError, match="holds 'graph.nnef' twice"):
        open_model(path)


def test_missing_dat_is_located_at_the_variable(tmp_path: Path) -> None:
    from cvmc.frontend.nnef import load_nnef
    from cvmc.ops.infer import retype

    (tmp_path / "graph.nnef").write_text(
        "version 1.0;\ngraph G( x ) -> ( y )\n{\n"
        "    x = external<integer>(shape = [2], precision = 8);\n"
        "    w = variable<integer>(shape = [2], label = 'w');\n"
        "    y = elemwise_add(x, w);\n}\n")
    with pytest.raises(CvmcError) as e:
        retype(load_nnef(tmp_path, None))
    assert str(e.value).startswith(f"{tmp_path / 'graph.nnef'}:5:9: error: weight 'w': its "
                                   f"data file 'w.dat' was not found")


def test_sparse_archive_members_are_refused(tmp_path: Path) -> None:
    """A sparse member (a few KB that expand to gigabytes of zeros) is never read."""
    sparse = tarfile.TarInfo("conv1/filter.dat")
    sparse.type = tarfile.GNUTYPE_SPARSE
    path = tmp_path / "m.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in _model_files().items():
            if name.endswith(".nnef"):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        tar.addfile(sparse, io.BytesIO(b""))
    with pytest.raises(CvmcError, match="'conv1/filter.dat' is a sparse file"):
        open_model(path)


# ---- issue 9, item 7: an archive is read only as far as the graph asks, within bounds -----
W_GRAPH = ("version 1.0;\ngraph G( x ) -> ( y )\n{\n"
           "    x = external<integer>(shape = [2], precision = 8);\n"
           "    w = variable<integer>(shape = [2], label = 'w', precision = 8);\n"
           "    v = variable<integer>(shape = [2], label = 'w', precision = 8);\n"
           "    s = elemwise_add(x, w);\n"
           "    y = elemwise_add(s, v);\n}\n")
W = np.array([3, -4], dtype=np.int32)


def _spy_on_members(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the archive members whose data cvmc reads, in order."""
    read: list[str] = []
    extract = tarfile.TarFile.extractfile

    def spy(self: tarfile.TarFile, member: tarfile.TarInfo):  # type: ignore[no-untyped-def]
        read.append(member.name)
        return extract(self, member)
    monkeypatch.setattr(tarfile.TarFile, "extractfile", spy)
    return read


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_archive_reads_only_the_members_the_graph_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Unused members (a weight of no variable, a graph.nnef too deep to be the model's,
    other files) are never read; a label used twice is read once."""
    from cvmc.frontend.nnef import load_nnef
    files = {"unused.dat": tensor_bytes(W), "graph.quant": b"\"x\": cvm_precision_spec(precision = 8);",
             "notes.txt": b"x" * 1000, "w.dat": tensor_bytes(W), "a/b/graph.nnef": b"?",
             "graph.nnef": W_GRAPH.encode()}
    path = _tar(tmp_path / "m.tar", files, mode)
    read = _spy_on_members(monkeypatch)
    graph = load_nnef(path, None)
    assert read == ["graph.quant", "graph.nnef", "w.dat"]
    assert np.array_equal(graph.constants["w"], W) and np.array_equal(graph.constants["v"], W)


@pytest.mark.parametrize("container", ["m.tgz", "folder"])
def test_dat_larger_than_its_variable_is_refused_before_reading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, container: str) -> None:
    """A 2-element variable's file may hold 128 + 2 * 8 bytes at most: a .dat member of
    8 MiB (a few KB compressed) fails at its header, at the variable's line, unread."""
    from cvmc.frontend.nnef import load_nnef
    files = {"graph.nnef": W_GRAPH.encode(), "w.dat": tensor_bytes(np.zeros(1 << 21, np.int32))}
    if container == "folder":
        path = tmp_path / "m"
        path.mkdir()
        for name, data in files.items():
            (path / name).write_bytes(data)
        graph_name = str(path / "graph.nnef")
    else:
        path, graph_name = _tar(tmp_path / container, files), f"{container}:graph.nnef"
    read = _spy_on_members(monkeypatch)
    with pytest.raises(CvmcError) as e:
        load_nnef(path, None)
    assert str(e.value).startswith(f"{graph_name}:5:9: error: ")
    assert "w.dat" in str(e.value) and "more than the 144 bytes its variable's declared shape" \
        in str(e.value)
    assert "w.dat" not in read


def test_graph_files_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """graph.nnef / graph.quant of any container, and a quantization file the user names,
    are read up to MAX_TEXT_BYTES (a path to an endless file, too)."""
    from cvmc.frontend import container
    monkeypatch.setattr(container, "MAX_TEXT_BYTES", 40)
    big = b"version 1.0;\n" + b" " * 100
    with pytest.raises(CvmcError, match="graph.nnef: 113 bytes, more than the 40 bytes a graph"):
        open_model(_tar(tmp_path / "m.tgz", {"graph.nnef": big}))
    (tmp_path / "g.nnef").write_bytes(big)
    with pytest.raises(CvmcError, match="g.nnef: more than the 40 bytes a graph"):
        open_model(tmp_path / "g.nnef")
    (tmp_path / "g.nnef").write_bytes(b"version 1.0;")
    with pytest.raises(CvmcError, match="zero: more than the 40 bytes"):
        open_model(tmp_path / "g.nnef", Path("/dev/zero"))


@pytest.mark.parametrize("secret", ["root:x:0:0:SECRET:/root\n", "SECRET_KEY=abc\n",
                                    "\n# a comment\nSECRET = 1;\n", "-----BEGIN SECRET-----"])
def test_files_that_are_no_model_document_are_never_echoed(tmp_path: Path,
                                                           secret: str) -> None:
    """A graph or quantization file that does not begin as one (a version line, a quoted
    tensor name) is refused without showing a byte of it (item 5)."""
    from cvmc.frontend.nnef import load_nnef
    (tmp_path / "graph.nnef").write_text(secret)
    (tmp_path / "other.quant").write_text(secret)
    with pytest.raises(CvmcError) as e:
        load_nnef(tmp_path, None)
    assert e.value.render() == (f"{tmp_path / 'graph.nnef'}:1:1: error: not an NNEF document: "
                                f"it must begin with 'version 1.0;' (NNEF 3.3); its content "
                                f"is not shown")
    (tmp_path / "graph.nnef").write_text("version 1.0; graph G( x ) -> ( x ) "
                                         "{ x = external<integer>(shape = [2]); }")
    with pytest.raises(CvmcError) as e:
        load_nnef(tmp_path, tmp_path / "other.quant")
    assert str(e.value).startswith(f"{tmp_path / 'other.quant'}:1:1: error: not a "
                                   f"quantization file")
    assert "SECRET" not in e.value.render()
