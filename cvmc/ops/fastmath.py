"""exp of float32 in TE: on the CPU path a polynomial with range reduction (it vectorises:
a vector of lanes costs about 20 vector instructions where libm's `expf` is one call per
lane), elsewhere the C math library's `expf` (CUDA keeps its own).

An op's lower rule writes exp as the call to `expf` (`te_exp`); lowering a kernel for a
target whose exp is the polynomial (`Target.polynomial_exp`) replaces each such call in its
PrimFunc by it (`cvmc.lowering.lower.lower_kernel`), a kernel lowered alone as one in a whole graph. The
reference interpreter does not change (NumPy's exp, the oracle): the bound covers the
difference. Steps, each in float32:

    n = floor(x log2(e) + 1/2);  r = (x - n C1) - n C2     (Cody-Waite: C1 + C2 = ln 2,
                                                            C1 with 10 bits, n C1 exact)
    p = 1 + r + r^2 P(r)                                   (P: Cephes' expf coefficients)
    exp(x) = p 2^(n - n//2) 2^(n//2)                       (two exact powers of two: a
                                                            subnormal result rounds once)

x is first clamped into [-104, 88.8], outside which exp rounds to 0 or overflows to inf
either way; a NaN stays NaN. Measured over all 2,239,863,196 float32 values in [-104, 88.8]
on a Zen 3 (with FMA): within 1 ULP of the correctly rounded exp (NumPy's float64 exp rounded
to float32); built without FMA, 1 ULP over every 13th value (docs/float.md;
tests/ops/test_fastmath.py sweeps densely). Every lane computes the same operations in the
same order, so the bits do not depend on the vector width or the thread count, nor on the
glibc version; LLVM may contract a multiply and an add into an FMA on a CPU that has one
(within the same bound).
"""
from __future__ import annotations

_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 = hi + lo; hi has 10 significant bits
# Cephes expf: exp(r) ~ 1 + r + r^2 P(r) on |r| <= ln(2) / 2, P's coefficients from r^5 down
_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
      5.0000001201e-1)
# exp(x) rounds to +inf above 88.7228 and to 0 below -103.98: a clamp beyond changes nothing
_HIGH, _LOW = 88.8, -104.0


def te_exp(x):
    """TE exp of the float32 expression `x`: the C math library's expf."""
    from cvmc.ops.te import tirx

    return tirx.call_pure_extern("float32", "expf", x)


def polynomial_exp(x):
    """exp of the float32 expression `x` by the polynomial (see the module docstring),
    written in the form TE's PrimFunc construction gives its comparisons and sums
    (`a < b`, `k + 127 - k // 2`)."""
    from cvmc.ops.te import tirx

    def f32(v):
        return tirx.const(v, "float32")

    def let(name, value, body):
        # one binding per value: the expression stays a tree of its size, not of its uses
        var = tirx.Var(name, "float32")
        return tirx.Let(var, value, body(var))

    def power_of_two(biased):
        return tirx.reinterpret("float32", biased << 23)

    def reduced(v, n):
        r = (v - n * f32(_LN2_HI)) - n * f32(_LN2_LO)
        return let("exp_r", r, lambda r: scaled(polynomial(r), n.astype("int32")))

    def polynomial(r):
        poly = f32(_P[0])
        for c in _P[1:]:
            poly = poly * r + f32(c)
        return poly * (r * r) + r + f32(1.0)

    def scaled(p, k):
        half = k >> 1  # floor(k / 2): both powers stay normal for k in [-150, 128]
        return p * power_of_two(k + 127 - half) * power_of_two(half + 127)

    def body(v):
        clamped = tirx.Select(f32(_HIGH) < v, f32(_HIGH),
                              tirx.Select(v < f32(_LOW), f32(_LOW), v))
        return let("exp_c", clamped, lambda c: let(
            "exp_n", tirx.floor(c * f32(_LOG2E) + f32(0.5)), lambda n: reduced(c, n)))

    return let("exp_x", x, lambda v: tirx.Select(tirx.isnan(v), v, body(v)))
