"""Where the shared corpus and specs are: `../shared` beside the checkout.

A user's clone has no `../shared`: tests that need it are skipped with the reason. CI has
it and must run them, so under CI (`CI` set, as `.ci/run` is run) its absence is an error.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
HAVE_SHARED = SHARED.is_dir()

if not HAVE_SHARED and os.environ.get("CI"):
    raise RuntimeError(f"CI runs need the shared corpus beside the checkout at {SHARED}")

requires_shared = pytest.mark.skipif(
    not HAVE_SHARED, reason=f"needs the shared corpus at {SHARED} (beside the checkout; "
                            f"CI has it)")


def run_doc_example(heading: str, folder: Path, document: str = "README.md") -> dict:
    """Run the first ```python block after `heading` in `document` (README.md or a page of
    docs/) inside `folder` (paths to `examples/` made absolute); returns the names it
    defined."""
    import re

    root = Path(__file__).resolve().parents[1]
    text = (root / document).read_text()
    section = text[text.index(heading):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    code = code.replace('"examples/', f'"{root}/examples/')
    cwd, scope = os.getcwd(), {}
    os.chdir(folder)
    try:
        exec(compile(code, document, "exec"), scope)  # noqa: S102 (the document's own example)
    finally:
        os.chdir(cwd)
    return scope
