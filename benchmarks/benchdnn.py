"""oneDNN benchdnn convolution shape lists (`../shared/data/benchdnn-conv-shapes/`) read
as 2D convolution geometries, batch 1.

A line holds descriptors such as
`g1mb50ic256ih56iw56oc512oh28ow28kh1kw1sh2sw2ph0pw0n"resnet_50:res3a_branch1*4"`: `_` is
an optional separator, a token starting with `#` comments out the rest of the line, and
the rules of benchdnn's `str2desc` / `sanitize_desc` fill in what is missing (see
`_complete`). The batch (`mb`) is ignored: every shape is timed at batch 1.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / \
    "benchdnn-conv-shapes"
_PAIR = re.compile(r"([a-z]+)(\d+)")
_KEYS = {"g", "mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw",
         "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw"}


class ShapeError(ValueError):
    """A descriptor this reader cannot turn into a CVM conv2d."""


@dataclass(frozen=True)
class ConvShape:
    """One conv layer: NCHW input (1, ic, ih, iw), OIHW weight (oc, ic / groups, kh, kw),
    symmetric padding (CVM's conv2d pads both sides alike), CVM dilation (1 = dense)."""

    name: str
    count: int  # how many times the layer occurs in the network
    groups: int
    ic: int
    ih: int
    iw: int
    oc: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]

    def out_hw(self) -> tuple[int, int]:
        """Output height and width (floor rule of CVM's conv2d)."""
        return tuple((size + 2 * p - ((k - 1) * d + 1)) // s + 1 for size, p, k, d, s in
                     zip((self.ih, self.iw), self.pad, (self.kh, self.kw), self.dilation,
                         self.stride))


def _complete(v: dict[str, int], axis: str) -> None:
    """benchdnn's defaults for one spatial axis ('h' or 'w'): stride 1, dilation 0 (dense),
    o from p (default 0) when o is missing, p from o when p is missing."""
    v.setdefault(f"s{axis}", 1)
    v.setdefault(f"d{axis}", 0)
    i, k, s = v[f"i{axis}"], v[f"k{axis}"], v[f"s{axis}"]
    span = (k - 1) * (v[f"d{axis}"] + 1) + 1
    if f"o{axis}" not in v:
        v.setdefault(f"p{axis}", 0)
        v[f"o{axis}"] = (i - span + 2 * v[f"p{axis}"]) // s + 1
    elif f"p{axis}" not in v:
        v[f"p{axis}"] = int(((v[f"o{axis}"] - 1) * s - i + span) / 2)  # C: toward zero


def parse_descriptor(text: str) -> ConvShape:
    """A ConvShape from one descriptor token (batch ignored)."""
    body, _, name = text.partition('n"')
    name = name.rstrip('"')
    v: dict[str, int] = {}
    for key, number in _PAIR.findall(body.replace("_", "")):
        if key not in _KEYS:
            raise ShapeError(f"{text}: unknown key '{key}'")
        v[key] = int(number)
    if any(k in v for k in ("id", "od", "kd")):
        raise ShapeError(f"{text}: a 3D convolution (CVM's conv2d is 2D)")
    for key in ("ic", "ih", "oc", "kh"):
        if key not in v:
            raise ShapeError(f"{text}: '{key}' is missing")
    for key in ("i", "o", "k", "s", "p", "d"):  # implicit square rule: w copies h
        if f"{key}h" in v:
            v.setdefault(f"{key}w", v[f"{key}h"])
    _complete(v, "h")
    _complete(v, "w")
    stem, star, count = name.rpartition("*")
    shape = ConvShape(stem if star else name, int(count) if star else 1, v.get("g", 1),
                      v["ic"], v["ih"], v["iw"], v["oc"], v["kh"], v["kw"],
                      (v["sh"], v["sw"]), (v["ph"], v["pw"]), (v["dh"] + 1, v["dw"] + 1))
    if shape.out_hw() != (v["oh"], v["ow"]):
        raise ShapeError(f"{text}: output {v['oh']}x{v['ow']} needs asymmetric padding")
    if shape.ic % shape.groups or shape.oc % shape.groups:
        raise ShapeError(f"{text}: channels are not a multiple of groups={shape.groups}")
    return shape


def read_shapes(path: Path) -> tuple[list[ConvShape], list[str]]:
    """(every 2D descriptor of a benchdnn shape file in order, commented ones left out;
    why each other descriptor was skipped: 1D/3D or asymmetric padding)."""
    shapes, skipped = [], []
    for line in path.read_text().splitlines():
        for token in line.split():
            if token.startswith("#"):
                break
            try:
                shapes.append(parse_descriptor(token))
            except ShapeError as e:
                skipped.append(str(e))
    return shapes, skipped


def shape_file(name: str, folder: Path = FOLDER) -> Path:
    """The file `shapes_<name>` of `folder`, underscores ignored ('resnet50' finds
    shapes_resnet_50); ShapeError naming the available sets otherwise."""
    files = {p.name.removeprefix("shapes_").replace("_", ""): p
             for p in sorted(folder.glob("shapes_*"))}
    if name.replace("_", "") not in files:
        raise ShapeError(f"no benchdnn shape set '{name}' in {folder} (available: "
                         f"{', '.join(p.name.removeprefix('shapes_') for p in files.values())})")
    return files[name.replace("_", "")]
