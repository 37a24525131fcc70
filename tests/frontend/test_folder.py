"""The model folder written into place atomically (cvmc/frontend/folder.py), which
`cvmc convert` and `cvmc quantize` write through."""
import pytest

from cvmc.errors import CvmcError
from cvmc.frontend.folder import model_folder


def _previous(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "graph.nnef").write_text("old")
    (out / "w.dat").write_bytes(b"old")
    return out


def test_a_failed_write_keeps_the_previous_model_and_leaves_nothing_beside(tmp_path):
    out = _previous(tmp_path)
    with pytest.raises(RuntimeError), model_folder(out, True, tmp_path / "m.onnx") as folder:
        (folder / "graph.nnef").write_text("new")
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in out.iterdir()) == ["graph.nnef", "w.dat"]
    assert (out / "graph.nnef").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_finished_write_replaces_the_previous_model_whole(tmp_path):
    out = _previous(tmp_path)
    with model_folder(out, True, tmp_path / "m.onnx") as folder:
        (folder / "graph.nnef").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["graph.nnef"]  # the old w.dat is gone
    assert (out / "graph.nnef").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_new_folder_is_made_with_its_parents(tmp_path):
    out = tmp_path / "a" / "b"
    with model_folder(out, False, tmp_path / "m.onnx") as folder:
        (folder / "graph.nnef").write_text("g")
    assert (out / "graph.nnef").read_text() == "g"


@pytest.mark.parametrize("force, files, message", [
    (False, {"graph.nnef": "old"}, "folder is not empty"),
    (True, {"notes.txt": "mine"}, "holds none"),
])
def test_refused_destinations_are_left_as_they_are(tmp_path, force, files, message):
    out = tmp_path / "out"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    with pytest.raises(CvmcError, match=message), \
            model_folder(out, force, tmp_path / "m.onnx") as folder:
        (folder / "graph.nnef").write_text("new")
    assert {p.name: p.read_text() for p in out.iterdir()} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_source_models_folder_is_refused(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"")
    with pytest.raises(CvmcError, match="holds the source model"), \
            model_folder(tmp_path, True, tmp_path / "m.onnx"):
        pass
