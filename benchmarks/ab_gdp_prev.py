"""GDP M=2 B4 T4096 with descriptors (graph replay), recurscan against an older package as recurscan_prev
(build/prev, see ab_prev.py), alternating: python benchmarks/ab_gdp_prev.py"""
import sys, torch, triton.testing as tt
sys.path.insert(0, "build/prev")
import recurscan, recurscan_prev
from recurscan.descriptors import build_chunk_descriptors
torch.manual_seed(0)
T, N, H, M, K = 4096, 4, 16, 2, 128
q = torch.randn(1, T * N, H, K, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, T * N * M, H, K, device="cuda", dtype=torch.bfloat16)
v = torch.randn(1, T * N * M, H, K, device="cuda", dtype=torch.bfloat16)
g = torch.nn.functional.logsigmoid(torch.randn(1, T * N, H, device="cuda"))
beta = torch.rand(1, T * N * M, H, device="cuda", dtype=torch.bfloat16)
cu = torch.arange(N + 1, device="cuda") * T
d = build_chunk_descriptors(cu.cpu(), M, device="cuda")
res = {}
for name, mod in (("ours", recurscan), ("prev", recurscan_prev), ("ours2", recurscan), ("prev2", recurscan_prev)):
    f = lambda: mod.chunk_gated_delta_product_varlen(q, k, v, g, beta, M, cu, use_qk_l2norm_in_kernel=True,
                                                     output_final_state=True, **d.as_kwargs())
    f(); torch.cuda.synchronize()
    with torch.no_grad():
        res[name] = tt.do_bench_cudagraph(f, rep=200, return_mode="median")
    print(name, f"{res[name]:.4f} ms (graph)", flush=True)
