"""Forms of the chunk's WY inverse, Tinv = (I + A)^-1 for a strictly lower [64, 64] A, each on
its own in a kernel of one program an item (issue 21: is the inverse what makes the prep's
program long, and does a form of small products shorten it?):

- ``full``: recursive block doubling on the whole [64, 64] tile (``kernels.delta.common._wy_inverse``
  without SPLIT), five levels of two [64, 64] products (on Hopper, wgmma with each operand staged
  through shared memory);
- ``blocks``: the four 16 x 16 diagonal blocks as one batch, a warp a block (three doubling levels
  of two batched 16 x 16 products), then merged 16 -> 32 (a batch of two) and 32 -> 64 (two
  [32, 32] products): ten products on mma.sync, none on [64, 64], the blocks moved through memory
  by the program. FlashInfer's SM90 prefill inverts this way (8 x 8 blocks by elimination first;
  docs/kernels-chunk-delta.md).
- ``split``: the prep's form on fp16 operands (``_wy_inverse``'s SPLIT 16, planned): the first
  three levels (2 -> 16) on the four 16 x 16 diagonal blocks as a [4, 16, 16] batch taken out of
  the [64, 64] tile in registers (six small products instead of six [64, 64] ones), the last two
  (16 -> 64) on the whole tile; ``split 32`` the same with levels 1-4 on the two 32 x 32 blocks.

Both with fp16 operands and float32 sums (the prep's INV_FP16 path, every chunk whose steps are
contractions); each reading A, or forming it from k and beta first as the prep's stage 2 does
("from k": one [64, 64] product over K = 128 for the prep's form, one batched product a level for
the blocks, no [64, 64] K K^T). CI runs every form under the interpreter against the float64 inverse
(tests/test_inverse_forms.py); on a GPU this times them:

    python benchmarks/inverse_forms.py --items 8192 --items 32768 --out benchmarks/results/inverse_forms.json
"""
from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

from recurscan.kernels.delta.common import _wy_inverse

BT = 64


@triton.jit
def full_inverse_kernel(a, k, beta, out, BT: tl.constexpr, K: tl.constexpr, FROM_K: tl.constexpr,
                        DT: tl.constexpr, SPLIT: tl.constexpr = 0):
    """out[n] = (I + A_n)^-1, the prep's form (:func:`_wy_inverse` from the exact 2 x 2 blocks, SPLIT
    passed on). A_n is ``a[n]``, or with FROM_K formed as the prep forms it:
    strictLower(diag(beta) K K^T) from ``k [n, BT, K]`` (16-bit) and ``beta [n, BT]``, one [BT, BT]
    product on DT operands."""
    n = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BT)
    offs = n * BT * BT + o[:, None] * BT + o[None, :]
    if FROM_K:
        b_k = tl.load(k + (n * BT + o)[:, None] * K + tl.arange(0, K)[None, :]).to(DT)
        b_beta = tl.load(beta + n * BT + o).to(tl.float32)
        b_A = tl.where(o[:, None] > o[None, :], tl.dot(b_k, tl.trans(b_k)) * b_beta[:, None], 0.0)
    else:
        b_A = tl.load(a + offs)
    eye = o[:, None] == o[None, :]
    b_T = eye.to(tl.float32) - tl.where((o[:, None] ^ o[None, :]) == 1, b_A, 0.0)
    tl.store(out + offs, _wy_inverse(b_T, b_A, o, True, "tf32", SPLIT))


@triton.jit
def _products(k, beta, n, rows, cols, BT: tl.constexpr, K: tl.constexpr, DT: tl.constexpr):
    """beta_i k_i . k_j for i in ``rows``, j in ``cols`` (index vectors [R], or [B, R] for a batch of
    blocks), the entries of A that FROM_K forms: one (batched) product over K."""
    if len(rows.shape) == 2:  # a batch of blocks: rows, cols [B, R]
        o_k = tl.arange(0, K)[None, None, :]
        k_r = tl.load(k + (n * BT + rows)[:, :, None] * K + o_k).to(DT)
        k_c = tl.load(k + (n * BT + cols)[:, :, None] * K + o_k).to(DT)
        return tl.dot(k_r, tl.trans(k_c, (0, 2, 1))) * tl.load(beta + n * BT + rows).to(tl.float32)[:, :, None]
    else:
        o_k = tl.arange(0, K)[None, :]
        k_r = tl.load(k + (n * BT + rows)[:, None] * K + o_k).to(DT)
        k_c = tl.load(k + (n * BT + cols)[:, None] * K + o_k).to(DT)
        return tl.dot(k_r, tl.trans(k_c)) * tl.load(beta + n * BT + rows).to(tl.float32)[:, None]


@triton.jit
def _dot16(x, y):
    """x y for (batches of) 16- or 32-row float32 tiles: fp16 operands, float32 sums."""
    return tl.dot(x.to(tl.float16), y.to(tl.float16))


@triton.jit
def blocks_inverse_kernel(a, k, beta, out, BT: tl.constexpr, K: tl.constexpr, FROM_K: tl.constexpr,
                          DT: tl.constexpr):
    """out[n] = (I + A_n)^-1 by 16 x 16 blocks (the module's ``blocks`` form); A_n as
    :func:`full_inverse_kernel` takes it, with FROM_K each block of it one (batched) product of
    k's row blocks (:func:`_products`), no [BT, BT] K K^T:

    1. the four diagonal blocks as one [4, 16, 16] batch (a warp a block), each inverted by its
       exact 2 x 2 blocks and three doubling levels (:func:`_wy_inverse`'s, at 16 rows);
    2. 16 -> 32: X21 = -D2 A21 D1 and X43 = -D4 A43 D3 as a [2, 16, 16] batch;
    3. 32 -> 64: the lower-left [32, 32] block -D_B A_BA D_A, D_A and D_B the 32 x 32 diagonal
       blocks written so far, read back from ``out`` (the program's own rows; a barrier between).
    """
    n = tl.program_id(0).to(tl.int64)
    base_a = a + n * BT * BT
    base_o = out + n * BT * BT
    o = tl.arange(0, 16)
    i3 = o[None, :, None]
    j3 = o[None, None, :]
    # 1. D_k = (I + A_kk)^-1, k = 1..4
    b4 = tl.arange(0, 4)[:, None, None] * 16
    diag = (b4 + i3) * BT + b4 + j3
    if FROM_K:
        r4 = tl.arange(0, 4)[:, None] * 16 + o[None, :]
        A = tl.where(i3 > j3, _products(k, beta, n, r4, r4, BT, K, DT), 0.0)
    else:
        A = tl.load(base_a + diag)
    D = (i3 == j3).to(tl.float32) - tl.where((i3 ^ j3) == 1, A, 0.0)
    for lvl in tl.static_range(1, 4):
        As = tl.where(((i3 >> lvl) ^ (j3 >> lvl)) == 1, A, 0.0)
        D = D - _dot16(D, _dot16(As, D))
    tl.store(base_o + diag, D)
    tl.debug_barrier()  # every warp's block written before any is read back
    # 2. the blocks below D1 and D3 (rows of D2, D4; columns of D1, D3)
    b2 = tl.arange(0, 2)[:, None, None] * 32
    below = (b2 + 16 + i3) * BT + b2 + j3
    D_odd, D_even = tl.load(base_o + below + 16), tl.load(base_o + below - 16 * BT)
    if FROM_K:
        r2 = tl.arange(0, 2)[:, None] * 32 + o[None, :]
        A_below = _products(k, beta, n, r2 + 16, r2, BT, K, DT)
    else:
        A_below = tl.load(base_a + below)
    X = -_dot16(D_odd, _dot16(A_below, D_even))
    tl.store(base_o + below, X)
    zero = tl.zeros([2, 16, 16], dtype=tl.float32)
    tl.store(base_o + (b2 + i3) * BT + b2 + 16 + j3, zero)  # above D1 and D3
    tl.debug_barrier()
    # 3. the lower-left [32, 32] block
    p = tl.arange(0, 32)
    tile = p[:, None] * BT + p[None, :]
    D_A = tl.load(base_o + tile)
    D_B = tl.load(base_o + 32 * BT + 32 + tile)
    if FROM_K:
        A_BA = _products(k, beta, n, p + 32, p, BT, K, DT)
    else:
        A_BA = tl.load(base_a + 32 * BT + tile)
    tl.store(base_o + 32 * BT + tile, -_dot16(D_B, _dot16(A_BA, D_A)))
    tl.store(base_o + 32 + tile, tl.zeros([32, 32], dtype=tl.float32))


#: Each form: its kernel, whether it forms A from k and beta (the prep's stage 2 as a whole) or
#: reads it, and the kernel's other flags.
FORMS = {"full": (full_inverse_kernel, False, {}), "blocks": (blocks_inverse_kernel, False, {}),
         "split": (full_inverse_kernel, False, {"SPLIT": 16}),
         "split 32": (full_inverse_kernel, False, {"SPLIT": 32}),
         "full, from k": (full_inverse_kernel, True, {}), "blocks, from k": (blocks_inverse_kernel, True, {}),
         "split, from k": (full_inverse_kernel, True, {"SPLIT": 16}),
         "split 32, from k": (full_inverse_kernel, True, {"SPLIT": 32})}


def unit_keys(n: int, device, seed: int = 0, correlated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k [n, 64, 128] bf16, beta [n, 64] float32)``: unit keys and beta in (0, 1), the prep's
    systems under l2norm (every step a contraction). ``correlated``: keys close to one direction
    (|k_i . k_j| near 1), the hard case for the inverse's error."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randn(n, BT, 128, generator=gen, dtype=torch.float64)
    if correlated:
        k = torch.randn(n, 1, 128, generator=gen, dtype=torch.float64) + 0.2 * k
    k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.rand(n, BT, generator=gen, dtype=torch.float64)
    return k.bfloat16().to(device), beta.float().to(device)


def system(k: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """A = strictLower(diag(beta) K K^T) of :func:`unit_keys`' keys, float32."""
    kd = k.double()
    return torch.tril(beta.double()[..., None] * (kd @ kd.transpose(1, 2)), -1).float()


def inverse(form: str, k: torch.Tensor, beta: torch.Tensor, A: torch.Tensor | None = None,
            num_warps: int = 4) -> torch.Tensor:
    """(I + A)^-1 for each item by the kernel of ``form`` (one program of ``num_warps`` warps an
    item); A (``system(k, beta)`` where None) is what the forms that do not form it read."""
    kernel, from_k, flags = FORMS[form]
    A = system(k, beta) if A is None and not from_k else A
    out = torch.empty(k.shape[0], BT, BT, dtype=torch.float32, device=k.device)
    # k's products on bf16 operands; float32 under Triton 3.6's interpreter, which multiplies bf16
    # tiles as their raw bits (as launch.delta does)
    dt = tl.float32 if os.environ.get("TRITON_INTERPRET") == "1" else tl.bfloat16
    kernel[(k.shape[0],)](k if from_k else A, k, beta, out, BT=BT, K=k.shape[2], FROM_K=from_k, DT=dt,
                          num_warps=num_warps, **flags)
    return out


def main():
    import triton.testing as tt
    from benchmarks.runner import save_rows
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, action="append", help="items (chunk, value head) a launch (repeatable; "
                                                               "8192 is B1 T16384 HV32's, 32768 B4 T8192 HV64's; "
                                                               "the SM count: one program an SM, its latency)")
    ap.add_argument("--num-warps", type=int, action="append", help="warps a program (repeatable; default 4)")
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for n in args.items or [8192, 32768]:
        k, beta = unit_keys(n, dev)
        A = system(k, beta)
        want = torch.linalg.inv(torch.eye(BT, dtype=torch.float64, device=dev) + A[:256].double())
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        for form in FORMS:
            for warps in args.num_warps or [4]:
                got = inverse(form, k, beta, A, warps)
                err = float(((got[:256].double() - want[:got.shape[0]]).norm() / want[:got.shape[0]].norm()).item())
                us = tt.do_bench(lambda: inverse(form, k, beta, A, warps), warmup=25, rep=200) * 1e3
                rows.append(dict(items=n, form=form, num_warps=warps, us=us, sm_us_per_item=us * sms / n,
                                 rel_error=err))
                print(f"{n:6d} items  {form:15s} {warps} warps {us:8.1f} us  ({us * sms / n:5.2f} SM-us an item)  "
                      f"error {err:.1e} relative", flush=True)
    if args.out:
        save_rows(rows, args.out, dev)


if __name__ == "__main__":
    main()
