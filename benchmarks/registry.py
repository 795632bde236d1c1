"""Named benchmark workloads: shapes, deterministic inputs, and the minimum FLOPs and HBM bytes.

A workload is data (a :class:`Workload`): its family, its shape, its dtypes, and what the call
asks for (L2 norm in the op, a final state, a state cache). From that it builds its inputs on any
device from a seed, and counts the work any implementation must do at least, so the runner can
turn a time into tokens/s, FLOP/s, bytes/s and a percentage of the device's ceilings.

Counting conventions (``flops()`` and ``hbm_bytes()``; see benchmarks/README.md for the table)
-----------------------------------------------------------------------------------------------
Chunked GDN / GDP forward, the fused chunk form of shared/PERF-NOTES.md, per value head and per
chunk window of ``c`` written rows (``c = 64`` except a sequence's last window) of which ``cq``
rows carry a query (``cq = c`` for GDN; on GDP's expanded stream only each token's last
Householder copy reads, so ``cq`` is about ``c / M``). Matrix products count 2 FLOPs per
multiply-add on dense tiles (what tensor cores execute), masks and elementwise work are not counted:

    K K^T            2 c^2 K      the WY system's Gram matrix
    K S              2 c K V      the state's prediction of the window's values
    solve            c (c^2 - 1) / 3   inverse of the unit lower-triangular (I + diag(beta) A)
    T X              2 c^2 V      the corrections v_new
    Q S              2 cq K V     the read of the entering state
    Q K^T            2 cq c K     the window's own attention scores
    (G o QK^T) v_new 2 cq c V
    K^T v_new        2 c K V      the state leaving the window

GDN at c = cq = 64, K = V = 128: 10,485,760 + 87,360 FLOPs per window, i.e. 163,840 + 1,365 =
165,205 FLOPs per token per value head (PERF-NOTES: "~164 kFLOP (+ the solve)"). Every term is
counted per value head; with grouped value heads (HV > H) the two q/k products could be shared
by a group, which this count does not assume.

Bytes: every input read once, every output written once, the state read and written once, at the
dtypes the workload's tensors have (q, k, v, beta and o in the workload dtype; g in float32; states
in ``state_dtype``; cu_seqlens int64; state indices int32). GDN bf16, K = V = 128: 4 x 256 B
(q, k, v, o) + 4 B (g) + 2 B (beta) = 1,030 B per token per value head when H = HV.

Decode (one token per request, against a state cache): GDN 7 K V FLOPs per request and value head
(decay K V, S^T k 2 K V, rank-1 write 2 K V, read 2 K V); SSD 5 P N per request and head (decay,
dt x B outer product and add, C contraction). Bytes as above, the state read + written dominating.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

CHUNK_SIZE = 64

# The 16 sequence lengths of gdn_varlen16_32976_hv32: a fixed, deterministic mix of long and
# short sequences, several not multiples of 64, summing to 32976 tokens.
VARLEN16_LENGTHS = (8192, 4096, 4096, 3000, 2048, 2048, 1999, 1500, 1337, 1024, 1000, 777, 700, 513, 400, 246)
assert len(VARLEN16_LENGTHS) == 16 and sum(VARLEN16_LENGTHS) == 32976

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64}


def _size(dtype: str) -> int:
    return torch.empty((), dtype=_DTYPES[dtype]).element_size()


def chunk_window_flops(c: int, cq: int, K: int, V: int) -> int:
    """FLOPs of one chunk window of the fused chunked delta-rule form, one value head (see the
    module docstring): ``c`` written rows, ``cq`` of them with a query."""
    return (2 * c * c * K          # K K^T
            + 2 * c * K * V        # K S
            + c * (c * c - 1) // 3  # unit lower-triangular inverse
            + 2 * c * c * V        # T X
            + 2 * cq * K * V       # Q S
            + 2 * cq * c * K       # Q K^T
            + 2 * cq * c * V       # (G o Q K^T) v_new
            + 2 * c * K * V)       # K^T v_new


def _query_rows(start: int, end: int, M: int) -> int:
    """Rows r in [start, end) of a sequence's expanded stream that carry a query (r % M == M - 1)."""
    return sum(1 for r in range(start, end) if r % M == M - 1)


@dataclass(frozen=True)
class Workload:
    """One named benchmark problem.

    family: "gdn" (chunked Gated DeltaNet forward), "gdp" (chunked Gated Delta Product forward),
        "gdn_decode" (one token per request against a state cache), "ssd_decode" (Mamba2
        selective_state_update, one token per request).
    seqlens: the length of every sequence (tokens, before GDP's M-fold expansion); ``varlen``
        packs them as B = 1 with cu_seqlens, else they are the B rows of a [B, T, ...] batch.
    heads / value_heads: H (q, k heads) and HV (v, g, beta, state heads); for SSD, heads is the
        number of B/C groups and value_heads the number of SSM heads.
    head_k / head_v: K and V (SSD: dstate and headdim).
    """

    name: str
    family: str
    seqlens: tuple[int, ...]
    heads: int
    value_heads: int
    head_k: int = 128
    head_v: int = 128
    num_householder: int = 1
    varlen: bool = False
    dtype: str = "bfloat16"
    gate_dtype: str = "float32"
    state_dtype: str = "float32"
    state_layout: str = "kv"  # gdn_decode: the cache laid out [S, HV, K, V] ("kv") or [S, HV, V, K] ("vk")
    use_qk_l2norm: bool = True
    initial_state: bool = False
    output_final_state: bool = True
    chunk_size: int = CHUNK_SIZE
    device: str = "cuda"  # where the workload is meant to run
    note: str = ""
    reference: dict[str, Any] = field(default_factory=dict)  # figures to compare with, and where from

    # ---- shape bookkeeping ---------------------------------------------------------------------
    @property
    def num_sequences(self) -> int:
        return len(self.seqlens)

    @property
    def tokens(self) -> int:
        """Tokens processed (decode: one per request)."""
        return sum(self.seqlens)

    @property
    def batch(self) -> int:
        return 1 if self.varlen else len(self.seqlens)

    @property
    def seqlen(self) -> int:
        """T of the [B, T, ...] input (the packed length for varlen)."""
        return self.tokens if self.varlen else self.seqlens[0]

    @property
    def is_decode(self) -> bool:
        return self.family.endswith("_decode")

    # ---- counts ----------------------------------------------------------------------------------
    def flops(self) -> int:
        """Minimum FLOPs (see the module docstring for the formula)."""
        K, V, HV = self.head_k, self.head_v, self.value_heads
        if self.family in ("gdn", "gdp"):
            M, C = self.num_householder, self.chunk_size
            per_head = 0
            for L in self.seqlens:
                rows = L * M  # GDP runs GDN's windows on the expanded stream
                for a in range(0, rows, C):
                    b = min(a + C, rows)
                    per_head += chunk_window_flops(b - a, _query_rows(a, b, M), K, V)
            return per_head * HV
        if self.family == "gdn_decode":
            return 7 * K * V * HV * self.num_sequences
        if self.family == "ssd_decode":
            return 5 * K * V * HV * self.num_sequences
        raise ValueError(f"unknown family {self.family!r}")

    def byte_breakdown(self) -> dict[str, int]:
        """Minimum HBM bytes per tensor: inputs read once, outputs written once, states once each way."""
        e, eg, es = _size(self.dtype), _size(self.gate_dtype), _size(self.state_dtype)
        N, H, HV, K, V, M = self.num_sequences, self.heads, self.value_heads, self.head_k, self.head_v, \
            self.num_householder
        T = self.tokens
        state = N * HV * K * V * es
        if self.family in ("gdn", "gdp", "gdn_decode"):
            parts = {"q": T * H * K * e, "k": T * M * H * K * e, "v": T * M * HV * V * e,
                     "g": T * HV * eg, "beta": T * M * HV * e, "o": T * HV * V * e}
            if self.family == "gdn_decode":
                parts.update(state_read=state, state_written=state, state_indices=N * 4)
            else:
                if self.initial_state:
                    parts["initial_state"] = state
                if self.output_final_state:
                    parts["final_state"] = state
                if self.varlen:
                    parts["cu_seqlens"] = (N + 1) * 8
            return parts
        if self.family == "ssd_decode":
            G, P, Ns, Hs = self.heads, self.head_v, self.head_k, self.value_heads
            return {"x": N * Hs * P * e, "dt": N * Hs * e, "B": N * G * Ns * e, "C": N * G * Ns * e,
                    "A": Hs * 4, "D": Hs * 4, "dt_bias": Hs * 4, "y": N * Hs * P * e,
                    "state_read": state, "state_written": state}
        raise ValueError(f"unknown family {self.family!r}")

    def hbm_bytes(self) -> int:
        return sum(self.byte_breakdown().values())

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (shape, options, counts)."""
        seqlens = list(self.seqlens)
        d = {
            "name": self.name, "family": self.family, "batch": self.batch, "seqlen": self.seqlen,
            "num_sequences": self.num_sequences, "varlen": self.varlen,
            "seqlens": seqlens if (self.varlen or len(set(seqlens)) > 1) else f"{len(seqlens)} x {seqlens[0]}",
            "heads": self.heads, "value_heads": self.value_heads, "head_k": self.head_k,
            "head_v": self.head_v, "num_householder": self.num_householder, "dtype": self.dtype,
            "gate_dtype": self.gate_dtype, "state_dtype": self.state_dtype,
            "use_qk_l2norm_in_kernel": self.use_qk_l2norm, "initial_state": self.initial_state,
            "output_final_state": self.output_final_state, "chunk_size": self.chunk_size,
            "intended_device": self.device, "tokens": self.tokens, "flops": self.flops(),
            "hbm_bytes": self.hbm_bytes(), "hbm_bytes_breakdown": self.byte_breakdown(),
            "note": self.note,
        }
        if self.family == "ssd_decode":
            d.update(ngroups=self.heads, nheads=self.value_heads, dstate=self.head_k, headdim=self.head_v)
        if self.reference:
            d["reference"] = self.reference
        return d

    # ---- inputs ----------------------------------------------------------------------------------
    def make_inputs(self, device: str | torch.device = "cpu", seed: int = 0) -> dict[str, Any]:
        """Deterministic inputs for this workload on ``device`` (same seed, same device: same values;
        CPU and CUDA generators differ). Returns a dict of tensors and options, named as the ops'
        arguments."""
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(seed)
        dt, gdt, sdt = _DTYPES[self.dtype], _DTYPES[self.gate_dtype], _DTYPES[self.state_dtype]

        def randn(*shape, dtype=torch.float32):
            return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

        N, H, HV, K, V, M = self.num_sequences, self.heads, self.value_heads, self.head_k, self.head_v, \
            self.num_householder
        if self.family == "ssd_decode":
            Hs, G, P, Ns = HV, H, V, K
            return {
                "state": randn(N, Hs, P, Ns, dtype=sdt) * 0.1,
                "x": randn(N, Hs, P, dtype=dt),
                "dt": randn(N, Hs, dtype=dt) * 0.5 - 1.0,  # before softplus and dt_bias
                "A": -torch.exp(randn(Hs) * 0.5),  # negative decay rates, float32
                "B": randn(N, G, Ns, dtype=dt),
                "C": randn(N, G, Ns, dtype=dt),
                "D": randn(Hs),
                "dt_bias": randn(Hs) * 0.1,
                "dt_softplus": True,
                "state_indices": torch.arange(N, device=device, dtype=torch.int32),
            }
        B, T = self.batch, self.seqlen
        inputs: dict[str, Any] = {
            "q": randn(B, T, H, K, dtype=dt),
            "k": randn(B, T * M, H, K, dtype=dt),
            "v": randn(B, T * M, HV, V, dtype=dt),
            # log decays: logsigmoid of N(3, 1), mean about -0.07 (g <= 0, never -inf here)
            "g": torch.nn.functional.logsigmoid(randn(B, T, HV) + 3.0).to(gdt),
            "beta": torch.sigmoid(randn(B, T * M, HV)).to(dt),  # in (0, 1)
            "use_qk_l2norm_in_kernel": self.use_qk_l2norm,
            "output_final_state": self.output_final_state,
            "cu_seqlens": None,
            "initial_state": None,
        }
        if self.varlen:  # boundaries on the token stream (seed 003), whatever M is
            bounds = [0]
            for L in self.seqlens:
                bounds.append(bounds[-1] + L)
            inputs["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int64, device=device)
        if self.family == "gdn_decode":
            if self.state_layout == "vk":  # a [S, HV, V, K] cache, passed as its [S, HV, K, V] view
                inputs["state"] = (randn(N, HV, V, K, dtype=sdt) * 0.1).transpose(-1, -2)
            else:
                inputs["state"] = randn(N, HV, K, V, dtype=sdt) * 0.1
            inputs["state_indices"] = torch.arange(N, device=device, dtype=torch.int32)
            inputs["output_final_state"] = True
        elif self.initial_state:
            inputs["initial_state"] = randn(N, HV, K, V, dtype=sdt) * 0.1
        return inputs


REGISTRY: dict[str, Workload] = {}


def register(w: Workload) -> Workload:
    if w.name in REGISTRY:
        raise ValueError(f"workload {w.name!r} registered twice")
    REGISTRY[w.name] = w
    return w


def get(name: str) -> Workload:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


_FLA_H200 = "DESIGN.md, figures measured on the GPU machine (one H200, torch 2.11, Triton 3.6.0)"

# ---- chunked GDN forward (GPU) --------------------------------------------------------------------
register(Workload("gdn_b1_t16384_h16_hv32", "gdn", (16384,), heads=16, value_heads=32,
                  reference={"fla chunk_gated_delta_rule fwd": "1.03 ms", "source": _FLA_H200}))
register(Workload("gdn_b1_t65536_h16_hv32", "gdn", (65536,), heads=16, value_heads=32,
                  reference={"fla chunk_gated_delta_rule fwd": "4.15 ms", "source": _FLA_H200}))
register(Workload("gdn_b1_t16384_h8_hv16", "gdn", (16384,), heads=8, value_heads=16,
                  note="half the heads of the headline workload: where the launch rows switch to segments"))
register(Workload("gdn_b2_t16384_h8_hv16", "gdn", (16384,) * 2, heads=8, value_heads=16,
                  note="the headline workload's value-head tokens in two sequences of half the heads: a phased, "
                       "chained row of more than one sequence"))
register(Workload("gdn_b4_t4096_h16", "gdn", (4096,) * 4, heads=16, value_heads=16,
                  reference={"fla chunk_gated_delta_rule fwd": "1.20 ms", "source": _FLA_H200}))
register(Workload("gdn_b4_t4096_h16_k64", "gdn", (4096,) * 4, heads=16, value_heads=16, head_k=64, head_v=128,
                  note="the B4 workload at K = 64: where the backward's Gluon twins are measured at that key size"))
register(Workload("gdn_b4_t8192_h16_hv64", "gdn", (8192,) * 4, heads=16, value_heads=64,
                  reference={"FlashQLA H200 table (PERF-NOTES)": "fla 3.36 ms, FlashInfer 0.83 ms, FlashQLA 1.21 ms"}))
register(Workload("gdn_varlen16_32976_hv32", "gdn", VARLEN16_LENGTHS, heads=16, value_heads=32, varlen=True,
                  note="16 packed sequences (registry.VARLEN16_LENGTHS), B = 1 with cu_seqlens",
                  reference={"fla chunk_gated_delta_rule fwd": "1.95 ms", "source": _FLA_H200}))
register(Workload("gdn_varlen16_32976_hv32_shortest_first", "gdn", VARLEN16_LENGTHS[::-1], heads=16, value_heads=32,
                  varlen=True, note="the same 16 sequences packed shortest first (a serving batch is not sorted)"))
# ---- chunked GDP forward (GPU) --------------------------------------------------------------------
register(Workload("gdp_m2_b4_t4096_h16", "gdp", (4096,) * 4, heads=16, value_heads=16, num_householder=2,
                  note="k, v, beta on the expanded stream [B, T*M, ...]; recurscan runs it as varlen B = 1",
                  reference={"fla chunk_gated_delta_product fwd": "0.98 ms", "source": _FLA_H200}))
register(Workload("gdp_m2_b4_t4096_h16_k64", "gdp", (4096,) * 4, heads=16, value_heads=16, num_householder=2,
                  head_k=64, head_v=128, note="the GDP workload at K = 64: where the Gluon twins' key-size rows are "
                                              "measured (plan.delta.GLUON_GDP_*_KEY_DIMS)"))
# ---- decode (GPU) -----------------------------------------------------------------------------------
register(Workload("gdn_decode_256", "gdn_decode", (1,) * 256, heads=16, value_heads=32,
                  note="256 requests x 1 token, fp32 state cache [256, 32, 128, 128], slots 0..255",
                  reference={"fla fused_recurrent GDN decode": "365 us (2.94 TB/s)", "source": _FLA_H200}))
register(Workload("gdn_decode_1024", "gdn_decode", (1,) * 1024, heads=16, value_heads=32,
                  note="1024 requests x 1 token, fp32 state cache [1024, 32, 128, 128], slots 0..1023"))
register(Workload("ssd_decode_256", "ssd_decode", (1,) * 256, heads=1, value_heads=80, head_k=128, head_v=64,
                  note="Mamba2 selective_state_update: 80 heads x headdim 64, dstate 128, 1 group, "
                       "fp32 state [256, 80, 64, 128]; dt, A, D, dt_bias per head (tied over headdim)",
                  reference={"mamba selective_state_update": "397 us (3.38 TB/s)", "source": _FLA_H200}))
# ---- CPU ----------------------------------------------------------------------------------------------
register(Workload("cpu_gdn_b1_t4096_h16", "gdn", (4096,), heads=16, value_heads=16, dtype="float32",
                  device="cpu", note="CPU comparison with transformers' pure-PyTorch chunked GDN",
                  reference={"transformers 5.24 torch_chunk_gated_delta_rule": "0.48 s on 2 cores",
                             "source": "DESIGN.md, CPU row"}))
register(Workload("cpu_gdn_smoke", "gdn", (200,), heads=2, value_heads=4, head_k=32, head_v=32, dtype="float32",
                  device="cpu", note="tiny smoke workload for tests and quick checks of the runner"))
