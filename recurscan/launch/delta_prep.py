"""The launches of the warp-specialised Gluon prep (kernels/gluon/delta_prep.py), built for
launch/delta.py's call values: the chunk vectors' pass, then the prep into the call's ``wy``,
``aqk`` and ``coef`` (the Triton prep's buffers, which the sweep reads). No decisions here.

    1. chunk_vectors_kernel   (chunks x H)               each chunk's gc, beta, rk, rq
    2. gluon_prep_kernel      (B x runs of CHUNKS x HV)  wy, aqk, coef
"""
from __future__ import annotations

import torch
import triton

from ..descriptors import CHUNK_SIZE
from ..kernels.delta.chunk_vectors import VECTOR_ROWS, chunk_vectors_kernel
from ..runtime.launcher import CallArg


def gluon_prep_call_ok(q, k, HV: int) -> bool:
    """Whether the Gluon prep takes this call's tensors: 16-bit q, k with K = 128, their base 16-byte
    aligned (the bulk copies' rule; the launch makes them contiguous), the vectors' coordinates
    (HV value heads) within int32."""
    B, T, H, K = q.shape
    slots = (B * T) // CHUNK_SIZE + B
    return q.dtype in (torch.bfloat16, torch.float16) and K == 128 and \
        all(x.data_ptr() % 16 == 0 for x in (q, k)) and slots * HV * VECTOR_ROWS * CHUNK_SIZE < 2 ** 31


def gluon_prep_steps(step_type, *, B, T, H, HV, K, scale, has_g, beta_name) -> tuple[dict, list]:
    """``(buffers, steps)``: the vectors ``vec`` (name -> (shape, dtype, fill)) and the two launches
    as ``step_type`` records (launch/delta.py's Step) for dense q, k ``[B, T, H, K]``, g and beta
    per head (``has_g``: a decay; ``beta_name`` the call value holding beta), writing the call's
    ``wy``, ``aqk`` and ``coef`` as the Triton prep does."""
    from ..kernels.gluon.delta_prep import BT, CHUNKS, LOAD_REGS, MAXNREG, NUM_STAGES, gluon_prep_kernel
    slots = (B * T) // CHUNK_SIZE + B
    buffers = {"vec": ((slots, HV, VECTOR_ROWS, CHUNK_SIZE), torch.float32, None)}
    n_chunks = B * triton.cdiv(T, CHUNK_SIZE)
    vectors = dict(q=CallArg("q"), k=CallArg("k"), g=CallArg("g" if has_g else "q"), beta=CallArg(beta_name),
                   vec=CallArg("vec"), cu_seqlens=CallArg("q"), chunk_indices=CallArg("q"), T=T, n_seq=0,
                   H=H, HV=HV, K=K, BT=CHUNK_SIZE, IS_VARLEN=False, HAS_G=has_g)
    prep = dict(q=CallArg("q"), k=CallArg("k"), vec=CallArg("vec"), wy=CallArg("wy"), aqk=CallArg("aqk"),
                coef=CallArg("coef"), scale=scale, T=T, n_vec=slots * HV * VECTOR_ROWS * CHUNK_SIZE,
                H=H, HV=HV, K=K, BT=BT, NUM_STAGES=NUM_STAGES, CHUNKS=CHUNKS, LOAD_REGS=LOAD_REGS)
    steps = []
    if n_chunks > 0:
        runs = triton.cdiv(triton.cdiv(T, BT), CHUNKS)
        steps.append(step_type(chunk_vectors_kernel, (n_chunks, H), vectors, dict(num_warps=4)))
        steps.append(step_type(gluon_prep_kernel, (B * runs * HV,), prep, dict(num_warps=4, maxnreg=MAXNREG)))
    return buffers, steps
