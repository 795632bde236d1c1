"""Does this Triton miscompile a product whose left operand is the transpose of another product's
result? fla's issue 640 (Hopper, Triton 3.4 to 3.7.0): ``tl.dot(tl.trans(x), y)`` with x in a
product's output layout. The delta-rule backward keeps away from the pattern
(kernels/delta/backward.py); this prints, per launch shape, the relative error of the pattern and of
the same product with x read back transposed from memory, against torch in float32.

    PYTHONPATH=$PWD python benchmarks/hopper_trans_check.py
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _trans_of_product(a, b, c, out, scratch, BT: tl.constexpr, BK: tl.constexpr, THROUGH_MEMORY: tl.constexpr):
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    b_a = tl.load(a + o_t[:, None] * BK + o_k[None, :])
    b_b = tl.load(b + o_t[:, None] * BK + o_k[None, :])
    b_c = tl.load(c + o_t[:, None] * BK + o_k[None, :])
    x = tl.dot(b_a, tl.trans(b_b))  # [BT, BT], a product's output layout
    x = tl.where(o_t[:, None] >= o_t[None, :], x, 0.0).to(tl.bfloat16)
    if THROUGH_MEMORY:
        tl.store(scratch + o_t[:, None] * BT + o_t[None, :], x)
        tl.debug_barrier()
        xt = tl.load(scratch + o_t[None, :] * BT + o_t[:, None], cache_modifier=".cg")
        y = tl.dot(xt, b_c)
    else:
        y = tl.dot(tl.trans(x), b_c)
    tl.store(out + o_t[:, None] * BK + o_k[None, :], y)


def main():
    torch.manual_seed(0)
    for BK in (64, 128):
        a, b, c = (torch.randn(64, BK, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        x = torch.tril(a.float() @ b.float().T).bfloat16().float()
        want = x.T @ c.float()
        for warps in (4, 8):
            for through in (False, True):
                out = torch.empty(64, BK, device="cuda")
                scratch = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
                _trans_of_product[(1,)](a, b, c, out, scratch, BT=64, BK=BK, THROUGH_MEMORY=through, num_warps=warps)
                err = ((out - want).norm() / want.norm()).item()
                print(f"triton {triton.__version__} BK {BK} warps {warps} "
                      f"{'through memory  ' if through else 'tl.trans(product)'}: relative error {err:.1e}")


if __name__ == "__main__":
    main()
