"""Small model layers that call recurscan's prefill ops, for the traced-scan tests (CPU and GPU)."""
import torch

import recurscan


class GdnLayer(torch.nn.Module):
    """Projections, recurscan's chunked GDN (l2norm in the op), an output projection."""

    def __init__(self, dim=32, heads=2, head_dim=16, num_householder=1):
        super().__init__()
        self.h, self.d, self.m = heads, head_dim, num_householder
        self.q = torch.nn.Linear(dim, heads * head_dim)
        self.kv = torch.nn.Linear(dim, 2 * num_householder * heads * head_dim)
        self.gb = torch.nn.Linear(dim, heads + num_householder * heads)
        self.out = torch.nn.Linear(heads * head_dim, dim)

    def forward(self, x, cu_seqlens=None):
        B, L, _ = x.shape
        M, H, D = self.m, self.h, self.d
        q = self.q(x).view(B, L, H, D)
        k, v = self.kv(x).view(B, L * M, 2, H, D).unbind(2)
        g, beta = self.gb(x).split([H, M * H], -1)
        g, beta = torch.nn.functional.logsigmoid(g), beta.reshape(B, L * M, H).sigmoid()
        if M == 1:
            o, _ = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                                    output_final_state=True, cu_seqlens=cu_seqlens)
        else:
            o, _ = recurscan.chunk_gated_delta_product_varlen(q, k, v, g, beta, M, cu_seqlens,
                                                              use_qk_l2norm_in_kernel=True, output_final_state=True)
        return self.out(o.reshape(B, L, -1))


class Mamba2Mixer(torch.nn.Module):
    """Mamba2's in-projection split into x, z, B, C, dt; recurscan's mamba_chunk_scan_combined (D,
    dt_bias, softplus, z gate); the out-projection."""

    def __init__(self, dim=32, heads=4, head_dim=8, state=16):
        super().__init__()
        self.h, self.p, self.n = heads, head_dim, state
        self.inp = torch.nn.Linear(dim, 2 * heads * head_dim + 2 * state + heads)
        self.A = torch.nn.Parameter(-torch.rand(heads))
        self.D = torch.nn.Parameter(torch.randn(heads))
        self.dt_bias = torch.nn.Parameter(torch.randn(heads))
        self.out = torch.nn.Linear(heads * head_dim, dim)

    def forward(self, u):
        Bt, L, _ = u.shape
        H, P, N = self.h, self.p, self.n
        x, z, B, C, dt = self.inp(u).split([H * P, H * P, N, N, H], -1)
        y = recurscan.mamba_chunk_scan_combined(x.view(Bt, L, H, P), dt, self.A, B.view(Bt, L, 1, N),
                                                C.view(Bt, L, 1, N), chunk_size=64, D=self.D, z=z.view(Bt, L, H, P),
                                                dt_bias=self.dt_bias, dt_softplus=True)
        return self.out(y.reshape(Bt, L, -1))


class GlaLayer(torch.nn.Module):
    """Projections, recurscan's chunk_simple_gla (a decay per head) or chunk_gla (per key)."""

    def __init__(self, dim=32, heads=2, head_dim=16, per_key=False):
        super().__init__()
        self.h, self.d, self.per_key = heads, head_dim, per_key
        self.qkv = torch.nn.Linear(dim, 3 * heads * head_dim)
        self.g = torch.nn.Linear(dim, heads * (head_dim if per_key else 1))
        self.out = torch.nn.Linear(heads * head_dim, dim)

    def forward(self, x):
        B, L, _ = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.h, self.d).unbind(2)
        g = torch.nn.functional.logsigmoid(self.g(x)) / 8
        if self.per_key:
            o, _ = recurscan.chunk_gla(q, k, v, g.view(B, L, self.h, self.d), output_final_state=True)
        else:
            o, _ = recurscan.chunk_simple_gla(q, k, v, g, output_final_state=True)
        return self.out(o.reshape(B, L, -1))


def scan_nodes(graph, name):
    return [n for n in graph.nodes if name in str(n.target)]
