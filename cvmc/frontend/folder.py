"""An NNEF model folder written into place atomically: `cvmc convert` and `cvmc quantize`
fill a folder beside the destination, renamed into place when complete, so a failed or
interrupted run leaves no partial folder and keeps the previous one."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cvmc.errors import CvmcError


def check_destination(out_dir: Path, force: bool, source: Path) -> None:
    """`out_dir` is new, an empty folder, or (with --force) a previous model folder; never
    the folder of the source model (or of the file a link to it names) or an ancestor."""
    dest = out_dir.resolve()
    for model in (source.absolute().parent.resolve() / source.name, source.resolve()):
        if model.is_relative_to(dest):  # the source, its external data, a link to them
            raise CvmcError(f"-o {out_dir}: holds the source model {source}; write the NNEF "
                            f"folder elsewhere")
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise CvmcError(f"-o {out_dir}: exists and is not a folder")
    if not any(out_dir.iterdir()):
        return
    if not force:
        raise CvmcError(f"-o {out_dir}: folder is not empty (--force replaces a previous "
                        f"model folder)")
    if not (out_dir / "graph.nnef").is_file():  # never delete a folder that is no model
        raise CvmcError(f"-o {out_dir}: --force replaces only a model folder (one holding "
                        f"graph.nnef), and this folder holds none")


@contextmanager
def model_folder(out_dir: Path, force: bool, source: Path) -> Iterator[Path]:
    """An empty folder to write the model of `source` into, renamed to `out_dir` (checked
    by `check_destination`) when the block ends without an exception; a previous model
    folder there is replaced."""
    check_destination(out_dir, force, source)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        folder = tmp / "model"  # made by mkdir: the user's umask, not mkdtemp's 0700
        folder.mkdir()
        yield folder
        if out_dir.exists() and any(out_dir.iterdir()):
            out_dir.rename(tmp / "previous")  # removed with the temporary folder
        folder.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
