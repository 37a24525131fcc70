"""benchdnn convolution shape lists (../shared/data/benchdnn-conv-shapes/): parse and scale.

The descriptor format and its implicit rules are those of benchdnn's `str2desc`
(tests/benchdnn/conv/conv_aux.cpp) and `sanitize_desc` (tests/benchdnn/common.cpp), as the
folder's README.md summarises: defaults g=1, mb=2, s=1, d=0 (benchdnn's dilation counts
from 0: oneDNN Graph's dilation is d + 1), a missing output size is computed, a missing
padding is deduced from the output size, a missing w copies h, missing h and w copy d,
and the right padding is whatever makes the output size come out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SHAPES_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / \
    "benchdnn-conv-shapes"
_KEYS = ("g", "mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw",
         "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw")
_FIELD = re.compile(r"_*(" + "|".join(sorted(_KEYS, key=len, reverse=True)) + r")(\d+)")


@dataclass(frozen=True)
class ConvShape:
    """One convolution: batch, groups, channels and per spatial dim (outermost first)
    input size, kernel, stride, oneDNN Graph dilation (1 = dense) and pads."""

    name: str
    mb: int
    g: int
    ic: int
    oc: int
    i: tuple[int, ...]
    k: tuple[int, ...]
    s: tuple[int, ...]
    d: tuple[int, ...]
    pad_l: tuple[int, ...]
    pad_r: tuple[int, ...]

    def out(self) -> tuple[int, ...]:
        """Output sizes by the spec's formula."""
        return tuple((i + pl + pr - 1 - (k - 1) * d) // s + 1 for i, k, s, d, pl, pr in
                     zip(self.i, self.k, self.s, self.d, self.pad_l, self.pad_r))


def _cdiv(a: int, b: int) -> int:
    """C's integer division (toward zero), as benchdnn computes."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def parse_descriptor(text: str) -> ConvShape:
    """One descriptor such as `g2mb256ic96ih27oc256oh27kh5ph2n"alexnet:conv2"`."""
    body, _, name = text.partition("n")
    body = body.rstrip("_")
    v: dict[str, int] = {}
    pos = 0
    while pos < len(body):
        m = _FIELD.match(body, pos)
        if not m:
            raise ValueError(f"bad benchdnn descriptor {text!r} at {body[pos:]!r}")
        v[m.group(1)] = int(m.group(2))
        pos = m.end()
    dims = {}
    for a in "dhw":
        # benchdnn: a dim is given by a nonzero size, kernel, output or dilation, a stride
        # other than 1 or a padding of at least 1
        given = any(v.get(f"{p}{a}", 0) for p in "iko") or v.get(f"d{a}", 0) or \
            v.get(f"s{a}", 1) != 1 or v.get(f"p{a}", 0) >= 1
        if not given:
            continue
        i, k, s, dd = v[f"i{a}"], v[f"k{a}"], v.get(f"s{a}", 1), v.get(f"d{a}", 0)
        span = (k - 1) * (dd + 1) + 1
        p = v.get(f"p{a}")
        o = v.get(f"o{a}")
        if o is None:
            p = p or 0
            o = _cdiv(i - span + 2 * p, s) + 1
        elif p is None:
            p = _cdiv((o - 1) * s - i + span, 2)
        dims[a] = (i, k, s, dd + 1, p, (o - 1) * s - i + span - p)
    if "d" in dims and not {"h", "w"} & set(dims):
        dims["h"] = dims["w"] = dims["d"]  # cubic
    elif "h" in dims and "w" not in dims and "d" not in dims:
        dims["w"] = dims["h"]  # square
    elif "d" in dims and len(dims) == 2 or not dims:
        raise ValueError(f"bad benchdnn descriptor {text!r}: spatial dims {sorted(dims)}")
    spatial = [dims[a] for a in "dhw" if a in dims]
    i, k, s, d, pad_l, pad_r = (tuple(col) for col in zip(*spatial))
    return ConvShape(name.strip('"'), v.get("mb", 2), v.get("g", 1), v["ic"], v["oc"], i, k,
                     s, d, pad_l, pad_r)


def read_shapes(path: Path) -> list[ConvShape]:
    """Every descriptor of a shapes file, in order ('#' comments out the rest of a line)."""
    out = []
    for line in path.read_text().splitlines():
        out += [parse_descriptor(tok) for tok in line.split("#", 1)[0].split()]
    return out


def scaled(shape: ConvShape, mb: int = 2, extra: int = 2) -> ConvShape:
    """The same layer on a small batch and a small image: batch min(mb, MB), each input
    size cut to at most the dilated kernel + `extra` strides (so every auto_pad mode still
    gives at least one output), padding kept (the right one clipped at 0: it may be
    negative in the lists, and oneDNN Graph pads are non-negative)."""
    i = tuple(min(x, (k - 1) * d + 1 + extra * s)
              for x, k, s, d in zip(shape.i, shape.k, shape.s, shape.d))
    return ConvShape(shape.name, min(mb, shape.mb), shape.g, shape.ic, shape.oc, i, shape.k,
                     shape.s, shape.d, shape.pad_l, tuple(max(p, 0) for p in shape.pad_r))
