"""`cvmc compile` progress: per stage and per kernel on a terminal, nothing otherwise."""
from __future__ import annotations

import io

from rich.console import Console

from cvmc.codegen import compile_model
from cvmc.codegen.progress import RichProgress
from tests.lowering.test_fusion_and_plan import cnn


def test_terminal_progress_names_stages_and_kernels(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    result = compile_model(cnn(), tmp_path / "m.cvmx", "llvm", progress=RichProgress(console))
    text = out.getvalue()
    assert "lower" in text and "schedule + build (llvm)" in text and "write artifact" in text
    kernels = len(result.plan["kernels"])
    assert kernels >= 4 and f"{kernels}/{kernels}" in text  # every kernel built


def test_quiet_without_progress(tmp_path, capsys):
    compile_model(cnn(), tmp_path / "m.cvmx", "llvm")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
