"""The signature compiled into every kernel library, and the check of a plan against it.

The compiler links into each library (CPU and CUDA) a function `cvmc_signature` that
returns a JSON text: the target and, for every kernel in call order, its symbol, its
number of inputs and its arguments (graph tensor names, shapes, dtypes, precisions) as
the compiler emitted them. A kernel checks only the shapes and dtypes it is handed, so two
same-shaped arguments swapped in an edited plan would run and give wrong results; the
runtime therefore refuses a plan that differs from its library's signature.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

from cvmc_runtime.signature import ModelError

SIGNATURE_FUNCTION = "cvmc_signature"
MAX_SIGNATURE_BYTES = 64 << 20  # as a plan (cvmc_runtime.artifact.MAX_JSON_BYTES)


def signature_json(target: Mapping, kernels: list[Mapping]) -> str:
    """The signature text for `target` and `kernels` ({symbol, num_inputs, args: [{name,
    shape, dtype, precision}]}), as the compiler compiles it into a library."""
    return json.dumps({"target": target, "kernels": kernels}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)


def _read(module) -> dict:
    """The library's signature, parsed."""
    try:
        function = module[SIGNATURE_FUNCTION]
    except AttributeError:
        raise ModelError("its kernel library has no signature (it was built by an older "
                         "cvmc): recompile the model") from None
    text = function()
    if not isinstance(text, str) or len(text) > MAX_SIGNATURE_BYTES:
        raise ModelError("its kernel library's signature is not a JSON text")
    try:
        signature = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ModelError(f"its kernel library's signature is not valid JSON ({e})") from None
    if not isinstance(signature, dict) or not isinstance(signature.get("kernels"), list):
        raise ModelError("its kernel library's signature has no kernel list")
    return signature


def check_library(plan: Mapping, module) -> None:
    """Raise ModelError unless `plan` (validated) calls exactly the kernels `module`
    declares, in its order, with its arguments, for its target."""
    signature = _read(module)
    if signature.get("target") != plan["target"]:
        raise _mismatch(f"target {plan['target']} in the plan but "
                        f"{signature.get('target')!r:.400} in the library")
    declared = signature["kernels"]
    if len(declared) != len(plan["kernels"]):
        raise _mismatch(f"the plan calls {len(plan['kernels'])} kernels, its library "
                        f"holds {len(declared)}")
    tensors = {s["name"]: s for key in ("inputs", "weights", "buffers", "outputs")
               for s in plan[key]}
    for index, (kernel, lib) in enumerate(zip(plan["kernels"], declared)):
        symbol = kernel["symbol"]
        if not isinstance(lib, Mapping) or lib.get("symbol") != symbol:
            raise _mismatch(f"kernel {index} is '{symbol}' in the plan but "
                            f"{_field(lib, 'symbol')} in the library")
        if lib.get("num_inputs") != kernel["num_inputs"]:
            raise _mismatch(f"kernel '{symbol}': {kernel['num_inputs']} inputs in the plan "
                            f"but {_field(lib, 'num_inputs')} in the library")
        args = lib.get("args")
        if not isinstance(args, list) or len(args) != len(kernel["args"]):
            count = len(args) if isinstance(args, list) else None
            raise _mismatch(f"kernel '{symbol}': {len(kernel['args'])} arguments in the "
                            f"plan but {count} in the library")
        for position, (name, arg) in enumerate(zip(kernel["args"], args)):
            if not isinstance(arg, Mapping) or arg.get("name") != name:
                raise _mismatch(f"kernel '{symbol}': argument {position} is '{name}' in the "
                                f"plan but {_field(arg, 'name')} in the library")
            # The precisions too: the compiler proved int32 never overflows inside them.
            keys = ("dtype", "shape", "precision")
            spec = tensors[name]
            if [arg.get(k) for k in keys] != [spec.get(k) for k in keys]:
                raise _mismatch(f"kernel '{symbol}': argument '{name}' is "
                                f"{', '.join(f'{k} {spec.get(k)}' for k in keys)} in the "
                                f"plan but {', '.join(f'{k} {_field(arg, k)}' for k in keys)} "
                                f"in the library")


def _mismatch(message: str) -> ModelError:
    return ModelError(f"the plan does not match its kernel library: {message}")


def _field(obj: object, key: str) -> str:
    """`obj[key]` for a message (short), whatever `obj` is."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return f"{value!r:.80}"
