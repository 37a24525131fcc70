"""Atomic file writes: a temporary file in the target folder, then a rename."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Create or replace `path` with what `write(file)` writes, all or nothing.

    The data goes to a temporary file in the same folder, is flushed to disk and renamed
    over `path`, so no reader, and no interrupted writer, ever leaves a half-written file.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Create or replace `path` with `data`, all or nothing."""
    atomic_write(path, lambda f: f.write(data))
