"""Two forms of the chunk's WY inverse, Tinv = (I + A)^-1 for a strictly lower [64, 64] A, each on
its own in a kernel of one program an item (issue 21: is the inverse what makes the prep's
program long, and does a form of small products shorten it?):

- ``full``: the prep's (``kernels.delta.common._wy_inverse``): recursive block doubling on the
  whole [64, 64] tile, five levels of two [64, 64] products (on Hopper, wgmma with each operand
  staged through shared memory);
- ``blocks``: the four 16 x 16 diagonal blocks inverted by doubling (three levels of two 16 x 16
  products each, the four independent), then merged 16 -> 32 -> 64 by 16 x 16 block products
  (:func:`_merged`): 40 products of 16 x 16 x 16 (on Hopper, mma.sync), the longest chain of them
  twelve. FlashInfer's SM90 prefill inverts this way (8 x 8 blocks by elimination first;
  docs/kernels-chunk-delta.md).

Both with fp16 operands and float32 sums (the prep's INV_FP16 path, every chunk whose steps are
contractions). CI runs both under the interpreter against the float64 inverse
(tests/test_inverse_forms.py); on a GPU this times them:

    python benchmarks/inverse_forms.py --items 8192 --items 32768 --out benchmarks/results/inverse_forms.json
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from recurscan.kernels.delta.common import _wy_inverse

BT = 64


@triton.jit
def full_inverse_kernel(a, out, BT: tl.constexpr):
    """out[n] = (I + a[n])^-1, the prep's form (:func:`_wy_inverse` from the exact 2 x 2 blocks)."""
    n = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BT)
    offs = n * BT * BT + o[:, None] * BT + o[None, :]
    b_A = tl.load(a + offs)
    eye = o[:, None] == o[None, :]
    b_T = eye.to(tl.float32) - tl.where((o[:, None] ^ o[None, :]) == 1, b_A, 0.0)
    tl.store(out + offs, _wy_inverse(b_T, b_A, o, True, "tf32"))


@triton.jit
def _dot16(x, y):
    """x y for [16, 16] float32 tiles, fp16 operands, float32 sums."""
    return tl.dot(x.to(tl.float16), y.to(tl.float16))


@triton.jit
def _diagonal_inverse(A, o):
    """(I + A)^-1 for a strictly lower [16, 16] A: the exact 2 x 2 blocks, then three doubling
    levels (:func:`_wy_inverse`'s, at 16 rows)."""
    T = (o[:, None] == o[None, :]).to(tl.float32) - tl.where((o[:, None] ^ o[None, :]) == 1, A, 0.0)
    for lvl in tl.static_range(1, 4):
        As = tl.where(((o[:, None] >> lvl) ^ (o[None, :] >> lvl)) == 1, A, 0.0)
        T = T - _dot16(T, _dot16(As, T))
    return T


@triton.jit
def _merged(A21, A31, A32, A41, A42, A43, D1, D2, D3, D4):
    """The off-diagonal 16 x 16 blocks of (I + A)^-1 from its diagonal blocks' inverses D_k and
    A's blocks A_ij: 16 -> 32 (X21 = -D2 A21 D1, X43 = -D4 A43 D3), then 32 -> 64, the lower
    32 x 32 block -D_B A_BA D_A with D_A = [[D1, 0], [X21, D2]], D_B = [[D3, 0], [X43, D4]]."""
    X21 = -_dot16(D2, _dot16(A21, D1))
    X43 = -_dot16(D4, _dot16(A43, D3))
    P3a = _dot16(A31, D1) + _dot16(A32, X21)  # A_BA D_A by blocks
    P3b = _dot16(A32, D2)
    P4a = _dot16(A41, D1) + _dot16(A42, X21)
    P4b = _dot16(A42, D2)
    X31 = -_dot16(D3, P3a)
    X32 = -_dot16(D3, P3b)
    X41 = -(_dot16(X43, P3a) + _dot16(D4, P4a))
    X42 = -(_dot16(X43, P3b) + _dot16(D4, P4b))
    return X21, X31, X32, X41, X42, X43


@triton.jit
def blocks_inverse_kernel(a, out, BT: tl.constexpr):
    """out[n] = (I + a[n])^-1 by 16 x 16 blocks (the module's ``blocks`` form)."""
    n = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, 16)
    base = a + n * BT * BT + o[:, None] * BT + o[None, :]
    A11 = tl.load(base)
    A21 = tl.load(base + 16 * BT)
    A22 = tl.load(base + 16 * BT + 16)
    A31 = tl.load(base + 32 * BT)
    A32 = tl.load(base + 32 * BT + 16)
    A33 = tl.load(base + 32 * BT + 32)
    A41 = tl.load(base + 48 * BT)
    A42 = tl.load(base + 48 * BT + 16)
    A43 = tl.load(base + 48 * BT + 32)
    A44 = tl.load(base + 48 * BT + 48)
    D1 = _diagonal_inverse(A11, o)
    D2 = _diagonal_inverse(A22, o)
    D3 = _diagonal_inverse(A33, o)
    D4 = _diagonal_inverse(A44, o)
    X21, X31, X32, X41, X42, X43 = _merged(A21, A31, A32, A41, A42, A43, D1, D2, D3, D4)
    dst = out + n * BT * BT + o[:, None] * BT + o[None, :]
    zero = tl.zeros([16, 16], dtype=tl.float32)
    tl.store(dst, D1)
    tl.store(dst + 16, zero)
    tl.store(dst + 32, zero)
    tl.store(dst + 48, zero)
    tl.store(dst + 16 * BT, X21)
    tl.store(dst + 16 * BT + 16, D2)
    tl.store(dst + 16 * BT + 32, zero)
    tl.store(dst + 16 * BT + 48, zero)
    tl.store(dst + 32 * BT, X31)
    tl.store(dst + 32 * BT + 16, X32)
    tl.store(dst + 32 * BT + 32, D3)
    tl.store(dst + 32 * BT + 48, zero)
    tl.store(dst + 48 * BT, X41)
    tl.store(dst + 48 * BT + 16, X42)
    tl.store(dst + 48 * BT + 32, X43)
    tl.store(dst + 48 * BT + 48, D4)


FORMS = {"full": full_inverse_kernel, "blocks": blocks_inverse_kernel}


def strict_lower_systems(n: int, device, seed: int = 0, correlated: bool = False) -> torch.Tensor:
    """[n, 64, 64] float32 A = strictLower(diag(beta) K K^T) of unit keys (K = 128) and beta in
    (0, 1): the prep's systems under l2norm (every step a contraction). ``correlated``: keys
    close to one direction (|k_i . k_j| near 1), the hard case for the inverse's error."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randn(n, BT, 128, generator=gen, dtype=torch.float64)
    if correlated:
        k = torch.randn(n, 1, 128, generator=gen, dtype=torch.float64) + 0.2 * k
    k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.rand(n, BT, 1, generator=gen, dtype=torch.float64)
    return torch.tril(beta * (k @ k.transpose(1, 2)), -1).float().to(device)


def inverse(form: str, A: torch.Tensor) -> torch.Tensor:
    """(I + A)^-1 for each [64, 64] A of ``A`` by the kernel of ``form`` (one program an item)."""
    out = torch.empty_like(A)
    FORMS[form][(A.shape[0],)](A, out, BT=BT, num_warps=4)
    return out


def main():
    import triton.testing as tt
    from benchmarks.runner import environment
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, action="append", help="items (chunk, value head) a launch (repeatable; "
                                                               "8192 is B1 T16384 HV32's, 32768 B4 T8192 HV64's)")
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for n in args.items or [8192, 32768]:
        A = strict_lower_systems(n, dev)
        want = torch.linalg.inv(torch.eye(BT, dtype=torch.float64, device=dev) + A[:256].double())
        for form in FORMS:
            got = inverse(form, A)
            err = float(((got[:256].double() - want).norm() / want.norm()).item())
            us = tt.do_bench(lambda: inverse(form, A), warmup=25, rep=200) * 1e3
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            rows.append(dict(items=n, form=form, us=us, sm_us_per_item=us * sms / n, rel_error=err))
            print(f"{n:6d} items  {form:6s} {us:8.1f} us  ({us * sms / n:5.2f} SM-us an item)  "
                  f"error {err:.1e} relative", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": environment(dev), "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
