"""transformers' Mamba2 model on the GPU, a forward over a prompt (prefill), with its own PyTorch
path and with recurscan's ``mamba_chunk_scan_combined`` in its place (issue 20: >= 3x faster).
bf16 weights, eager, L2 flushed (``triton.testing.do_bench``); the logits of both against the
model's own path in float32 (relative error).

    PYTHONPATH=$PWD python benchmarks/gpu_transformers_mamba2.py --out benchmarks/results/gpu_transformers_mamba2.json

The model: 4 layers, hidden 1024, 32 heads x 64, dstate 128, one group, chunk 256 (Mamba2-370m's
mixer shape, fewer layers); the prompt B4 x T2048.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton.testing as tt

from benchmarks.cpu_transformers_mamba2 import recurscan_in_place


def model_and_prompt(batch, seqlen, seed=0):
    from transformers import Mamba2Config, Mamba2ForCausalLM
    from transformers.models.mamba2 import modeling_mamba2 as module
    torch.manual_seed(seed)
    config = Mamba2Config(vocab_size=1024, hidden_size=1024, num_hidden_layers=4, num_heads=32, head_dim=64,
                          state_size=128, n_groups=1, expand=2, chunk_size=256, conv_kernel=4)
    model = Mamba2ForCausalLM(config).cuda().eval()
    prompt = torch.randint(0, config.vocab_size, (batch, seqlen), device="cuda")
    return model, prompt, module


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--out")
    args = ap.parse_args()
    model, prompt, module = model_and_prompt(args.batch, args.seqlen)
    forward = lambda: model(prompt, use_cache=False).logits  # noqa: E731
    with torch.no_grad():
        want = forward().float()
        model.bfloat16()
        rows = []
        for impl, backend in (("transformers torch", None), ("recurscan triton", "triton")):
            if backend is None:
                logits, ms, calls = forward().float(), tt.do_bench(forward, rep=300, return_mode="median"), None
            else:
                with recurscan_in_place(module, backend) as calls:
                    logits = forward().float()
                    ms = tt.do_bench(forward, rep=300, return_mode="median")
            err = ((logits - want).norm() / want.norm()).item()
            rows.append(dict(impl=impl, ms=ms, logits_rel_err_vs_fp32_torch=err, calls=calls))
            print(f"mamba2 B{args.batch} T{args.seqlen} {impl:<19} {ms:8.3f} ms  logits rel err {err:.1e}"
                  f"{'' if calls is None else f'  calls {calls}'}", flush=True)
    if rows[1]["calls"]["chunk_scan"] == 0:
        raise SystemExit("recurscan's op was never called: the model took another path")
    print(f"speed-up {rows[0]['ms'] / rows[1]['ms']:.2f}x")
    if args.out:
        json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(), batch=args.batch,
                       seqlen=args.seqlen, rows=rows), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
