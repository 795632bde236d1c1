"""The planner's cost model (the chunked algorithm's ``chunk_cost`` / ``step_time``, recurscan/algebra.py) with
a device's measured ceilings: predicted times of the two schedules of a delta-rule prefill, the
chunked kernels and the streaming kernel, so that a choice between them and a prediction can be
printed beside what was measured (``recurscan plan``, recurscan/cli.py).

Chunked: ``step_time`` over the (sequence, value head) pairs at 64-token chunks, its latency the
chain of one program's chunks at the measured time of a chunk step, against the time the HBM
needs for the inputs and outputs once (the larger of the two; the sweep's programs walk their
chains at once). Streaming: one token step at a time at the measured latency, against the same
bytes. Neither counts launches (a few microseconds) or a second wave of programs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra import step_time

CHUNK = 64


@dataclass(frozen=True)
class DeviceCeilings:
    """What a device was measured to sustain (the design notes' figures; docs/perf-history.md)."""

    name: str
    bytes_per_s: float  # HBM: a device-to-device copy, bytes read + written
    matmul_flops: float  # bf16 matrix products
    scalar_ops: float  # float32 elementwise operations
    chunk_step_s: float  # one 64-token chunk of the chunked sweep's chain (one program)
    token_step_s: float  # one token of the streaming kernel's chain (one program)
    source: str


CEILINGS = {
    "H200": DeviceCeilings(
        "H200", 4.27e12, 782e12, 60e12, 1.6e-6, 0.6e-6,
        "copy 4.27 TB/s and bf16 matmul 8192^3 782 TFLOP/s (DESIGN.md); float32 elementwise taken as 60 T op/s "
        "(not measured); the delta sweep 1.6 us a chunk at BV 64 (perf-history, the Gluon prototype's Triton "
        "baseline); streaming prefill 0.58-0.60 us a token at B1 HV32 (perf-history, 3156e2d)"),
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


def predict_chunked(tokens: int, sequences: int, heads: int, value_heads: int, key_dim: int, value_dim: int,
                    ceilings: DeviceCeilings, householder: int = 1) -> Prediction:
    """The chunked kernels on ``tokens`` tokens in ``sequences`` equal sequences (``householder``:
    GDP's M, 1 for GDN).

    Example (GDN B1 T16384 H16 HV32 K = V = 128 on the H200's ceilings; measured 0.517 ms, graph
    replay at b47c7e4, and 0.536 eager at cbdac89):
        >>> from recurscan.plan.cost import CEILINGS, predict_chunked
        >>> p = predict_chunked(16384, 1, 16, 32, 128, 128, CEILINGS["H200"])
        >>> round(p.seconds * 1e3, 3), p.bound
        (0.476, 'chain')
    """
    T = -(-tokens // max(sequences, 1)) * householder
    pairs = sequences * value_heads
    full = step_time(T, CHUNK, key_dim, value_dim, pairs, ceilings.matmul_flops, ceilings.scalar_ops,
                     ceilings.chunk_step_s)
    chain = -(-T // CHUNK) * ceilings.chunk_step_s
    compute = full - chain
    memory = _bytes(tokens, heads, value_heads, key_dim, value_dim, sequences, householder) / ceilings.bytes_per_s
    seconds = max(compute + chain, memory)
    bound = "memory" if memory >= compute + chain else ("chain" if chain >= compute else "compute")
    return Prediction(seconds, compute, memory, chain, bound)


def predict_streaming(tokens: int, sequences: int, heads: int, value_heads: int, key_dim: int, value_dim: int,
                      ceilings: DeviceCeilings, householder: int = 1) -> Prediction:
    """The streaming kernel on the same tokens: each program walks its sequence's tokens.

    Example (as :func:`predict_chunked`'s; measured 9.50 ms at 3156e2d, docs/perf-history.md):
        >>> from recurscan.plan.cost import CEILINGS, predict_streaming
        >>> round(predict_streaming(16384, 1, 16, 32, 128, 128, CEILINGS["H200"]).seconds * 1e3, 2)
        9.83
    """
    T = -(-tokens // max(sequences, 1)) * householder
    chain = T * ceilings.token_step_s
    memory = _bytes(tokens, heads, value_heads, key_dim, value_dim, sequences, householder) / ceilings.bytes_per_s
    # the state read and written once per sequence is in the bytes; every token's [K, V] update
    # stays on chip
    compute = tokens * householder * value_heads * key_dim * value_dim * 4 / ceilings.scalar_ops
    seconds = max(chain, memory, compute)
    bound = "memory" if seconds == memory else ("chain" if seconds == chain else "compute")
    return Prediction(seconds, compute, memory, chain, bound)
