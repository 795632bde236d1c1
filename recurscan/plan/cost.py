"""The planner's cost model (the chunked algorithm's ``chunk_cost``, recurscan/algebra.py) with a
device's measured ceilings: predicted times of the two schedules of a delta-rule prefill, the
chunked kernels and the streaming kernel, so that a choice between them and a prediction can be
printed beside what was measured (``recurscan plan``, recurscan/cli.py).

Each schedule costs a fixed part (its launches) plus the largest of three bounds, which overlap:

- compute: the work over the whole machine at the kernels' sustained rate. Chunked: ``chunk_cost``'s
  FLOPs of every (sequence, value head) pair, its chunks counted whole (the kernels compute
  64-row tiles however few rows are live), at the FLOP rate the chunked kernels sustain when
  every SM is busy. Streaming: the ``4 K V`` state operations of every token and value head at
  the rate the streaming kernel sustains.
- chain: one sequence's steps one after another (its chunks at the chunk step, its tokens at the
  token step), which no number of SMs shortens.
- memory: q, k, v, o, the gates and the final states once through HBM.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..algebra import chunk_cost

CHUNK = 64


@dataclass(frozen=True)
class DeviceCeilings:
    """What a device was measured to sustain (docs/perf-history.md has the runs)."""

    name: str
    bytes_per_s: float  # HBM: a device-to-device copy, bytes read + written
    chunked_flops: float  # chunk_cost FLOPs per second of the chunked kernels, every SM busy
    streaming_ops: float  # state operations (4 K V a token and value head) per second of the streaming kernel
    chunk_step_s: float  # one 64-token chunk of the chunked sweep's chain (one program)
    token_step_s: float  # one token of the streaming kernel's chain (one program)
    chunked_fixed_s: float  # the chunked launches' fixed cost (CUDA-graph replay)
    streaming_fixed_s: float  # the streaming launch's fixed cost (CUDA-graph replay)
    source: str


CEILINGS = {
    "H200": DeviceCeilings(
        "H200", 4.27e12, 124e12, 9.35e12, 1.90e-6, 0.547e-6, 10.8e-6, 2.5e-6,
        "copy 4.27 TB/s (DESIGN.md); from issue 22's table at cdc4e1d (GDN H16 HV32 K = V = 128 bf16, graph "
        "replay, results/gpu_plan_table_cdc4e1d.json), three of its 39 rows: N64 T16384 (chunked 27.07 ms: "
        "124 TFLOP/s of chunk_cost; streaming 235.8 ms: 9.35 T state op/s), N1 T65536 (chunked 1.95 ms: 1.90 us "
        "a chunk; streaming 35.8 ms: 0.547 us a token), N1 T1 (chunked 12.7 us, streaming 3.0 us: the fixed parts)"),
}


def ceilings_for(device_name: str) -> DeviceCeilings | None:
    """The measured ceilings of the first entry of :data:`CEILINGS` whose key is in the device's
    name, or None (no prediction for an unmeasured device)."""
    for key, c in CEILINGS.items():
        if key in device_name:
            return c
    return None


@dataclass(frozen=True)
class Prediction:
    """A predicted time and what bounds it."""

    seconds: float
    compute_s: float
    memory_s: float
    chain_s: float
    bound: str

    def __str__(self) -> str:
        return (f"{self.seconds * 1e3:.3f} ms ({self.bound}-bound; compute {self.compute_s * 1e3:.3f}, "
                f"memory {self.memory_s * 1e3:.3f}, chain {self.chain_s * 1e3:.3f} ms)")


def _bytes(tokens: int, heads: int, value_heads: int, key_dim: int, value_dim: int, sequences: int,
           householder: int = 1, element: int = 2) -> int:
    """q, k, v, o, g and beta once in HBM, and each sequence's float32 final state written."""
    qk = tokens * heads * key_dim * element * (1 + householder)
    vo = tokens * value_heads * value_dim * element * (householder + 1)
    gates = tokens * value_heads * (4 + householder * element)
    return qk + vo + gates + sequences * value_heads * key_dim * value_dim * 4


def _predict(fixed: float, compute: float, memory: float, chain: float) -> Prediction:
    slowest = max(compute, memory, chain)
    bound = "memory" if slowest == memory else ("chain" if slowest == chain else "compute")
    return Prediction(fixed + slowest, compute, memory, chain, bound)


def predict_chunked(tokens: int, sequences: int, heads: int, value_heads: int, key_dim: int, value_dim: int,
                    ceilings: DeviceCeilings, householder: int = 1) -> Prediction:
    """The chunked kernels on ``tokens`` tokens in ``sequences`` equal sequences (``householder``:
    GDP's M, 1 for GDN).

    Example (GDN B1 T16384 H16 HV32 K = V = 128 on the H200's ceilings; measured 0.527 ms, graph
    replay at cdc4e1d):
        >>> from recurscan.plan.cost import CEILINGS, predict_chunked
        >>> p = predict_chunked(16384, 1, 16, 32, 128, 128, CEILINGS["H200"])
        >>> round(p.seconds * 1e3, 3), p.bound
        (0.497, 'chain')
    """
    T = -(-tokens // max(sequences, 1)) * householder
    chunks = -(-T // CHUNK)
    flops = chunk_cost(chunks * CHUNK, CHUNK, key_dim, value_dim).flops * sequences * value_heads
    memory = _bytes(tokens, heads, value_heads, key_dim, value_dim, sequences, householder) / ceilings.bytes_per_s
    return _predict(ceilings.chunked_fixed_s, flops / ceilings.chunked_flops, memory, chunks * ceilings.chunk_step_s)


def predict_streaming(tokens: int, sequences: int, heads: int, value_heads: int, key_dim: int, value_dim: int,
                      ceilings: DeviceCeilings, householder: int = 1) -> Prediction:
    """The streaming kernel on the same tokens: each program walks its sequence's tokens, the
    state on chip (read and written once, in the bytes).

    Example (as :func:`predict_chunked`'s; measured 8.80 ms at cdc4e1d):
        >>> from recurscan.plan.cost import CEILINGS, predict_streaming
        >>> round(predict_streaming(16384, 1, 16, 32, 128, 128, CEILINGS["H200"]).seconds * 1e3, 2)
        8.96
    """
    T = -(-tokens // max(sequences, 1)) * householder
    ops = tokens * householder * value_heads * key_dim * value_dim * 4
    memory = _bytes(tokens, heads, value_heads, key_dim, value_dim, sequences, householder) / ceilings.bytes_per_s
    return _predict(ceilings.streaming_fixed_s, ops / ceilings.streaming_ops, memory, T * ceilings.token_step_s)


@lru_cache(maxsize=4096)
def prefill_algorithm(tokens: int, sequences: int, heads: int, value_heads: int, key_dim: int, value_dim: int,
                      device_name: str) -> str:
    """The schedule a delta-rule prefill of ``tokens`` tokens in ``sequences`` sequences should take
    on the named device: "recurrent" (the streaming kernel) where the model predicts it faster,
    else "chunked"; always "chunked" on a device without measured ceilings (ties too).

    Example (64 requests of 4 tokens on the H200: measured 0.106 ms streaming, 0.185 chunked; of 16
    tokens: 0.264 and 0.190):
        >>> from recurscan.plan.cost import prefill_algorithm
        >>> prefill_algorithm(256, 64, 16, 32, 128, 128, "NVIDIA H200")
        'recurrent'
        >>> prefill_algorithm(1024, 64, 16, 32, 128, 128, "NVIDIA H200")
        'chunked'
        >>> prefill_algorithm(256, 64, 16, 32, 128, 128, "cpu")
        'chunked'
    """
    ceilings = ceilings_for(device_name)
    if ceilings is None:
        return "chunked"
    sizes = (tokens, sequences, heads, value_heads, key_dim, value_dim, ceilings)
    return "recurrent" if predict_streaming(*sizes).seconds < predict_chunked(*sizes).seconds else "chunked"
