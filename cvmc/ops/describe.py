"""Text generated from the op records: the NNEF declarations cvmc uses and the op table.

- `nnef_declaration(d)`: an NNEF op's `fragment` declaration (no body), written from its
  entry's inputs, types, attributes and outputs. The frontend parses these for the NNEF
  primitives (`cvmc.frontend.fragments.stdlib`); Khronos' stdlib text stays the spec they
  are tested against (tests/ops/test_declarations.py).
- `op_table()`: the Markdown table of every op, `docs/ops.md` (`cvmc ops --markdown`
  writes it; a test checks the checked-in file is what the records give).
"""
from __future__ import annotations

from cvmc.ops.registry import REQUIRED, OpDef, all_ops, nnef_literal

# the zero an optional tensor input defaults to (NNEF writes conv's bias = 0.0)
_ZERO = {"scalar": "0.0", "integer": "0", "logical": "false"}


def nnef_ops() -> list[OpDef]:
    """The ops of NNEF's op set (its primitives, and cvmc's own NNEF-typed ops)."""
    return [d for d in all_ops() if "nnef" in d.seeds]


def nnef_name(d: OpDef) -> str:
    """The name an NNEF document calls the op by (`nnef.reshape`: `reshape`)."""
    return d.name.removeprefix("nnef.")


def _tensor(kind: str) -> str:
    """`tensor<kind>` for an element kind of `OpDef.types` (`?[]`: an array of them)."""
    item = kind.removesuffix("[]")
    text = f"tensor<{'' if item == 'any' else item}>"
    return text + "[]" if kind.endswith("[]") else text


def nnef_declaration(d: OpDef) -> str:
    """The NNEF `fragment` declaration of typed op `d`, on one line."""
    params = []
    for k, name in enumerate(d.inputs):
        kind = d.in_kinds[min(k, len(d.in_kinds) - 1)]
        text = f"{name.strip('?*')}: {_tensor(kind)}"
        params.append(text + f" = {_ZERO[kind]}" if name.endswith("?") else text)
    for at in d.attrs:
        text = f"{at.name}: {at.nnef_type}"
        params.append(text if at.default is REQUIRED else f"{text} = {nnef_literal(at.default)}")
    out_kind = d.out_kind + ("[]" if d.variadic_outputs else "")
    results = [f"{name.strip('*')}: {_tensor(out_kind)}" for name in d.outputs]
    generic = "<?>" if "?" in (*(k.removesuffix("[]") for k in d.in_kinds), d.out_kind) \
        else ""
    return (f"fragment {nnef_name(d)}{generic}( {', '.join(params)} ) -> "
            f"( {', '.join(results)} );")


def nnef_declarations() -> str:
    """Every NNEF op's declaration, one a line."""
    return "".join(nnef_declaration(d) + "\n" for d in nnef_ops())


def cvm_spellings(d: OpDef) -> str:
    """CVM-Runtime's spellings where they differ from cvmc's (`get_valid_counts`,
    `stride: strides`), which `cvmc export` writes; '' where none do."""
    names = [d.cvm_name] if d.cvm_name != d.name else []
    names += [f"{a.name}: {a.cvm_name}" for a in d.attrs if a.cvm_name not in ("", a.name)]
    return ", ".join(names)


def op_table() -> str:
    """docs/ops.md: every op, one row each, as its record states it."""
    lines = ["# Operators", "",
             ("Generated from the op records (`cvmc ops --markdown > docs/ops.md`); "
              "`cvmc ops` prints the same."), "",
             ("| op | op set | family | fusion | inputs | attributes | types | precision | "
              "accuracy | CVM-Runtime |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for d in all_ops():
        name = f"`{d.name}`" + "".join(f", `{a}`" for a in d.aliases)
        attrs = "; ".join(a.describe() for a in d.attrs)
        cells = [name, ", ".join(d.seeds), d.family, d.fusion.value, ", ".join(d.inputs),
                 attrs, d.types, d.precision_rule, f"{d.ulp} ULP" if d.ulp else "",
                 cvm_spellings(d)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
