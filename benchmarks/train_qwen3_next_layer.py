"""A training run people recognise: transformers' Qwen3-Next GatedDeltaNet layer (Qwen3-Next's head
sizes: 16 key heads, 32 value heads, 128 x 128) in a small language model, trained with AdamW on
a synthetic copy task, twice from the same initial weights and batches:

- ``recurscan``: the layer's ``torch_chunk_gated_delta_rule`` replaced by
  ``recurscan.chunk_gated_delta_rule`` (Triton forward, chunkwise backward), model in bf16;
- ``torch``: the layer's own PyTorch path, model in float32;
- ``torch_bf16``: the layer's own PyTorch path, model in bf16: the noise band. bf16 weights and
  activations alone move the curve this far from float32's; recurscan's run is within noise when
  its distance from float32's is of that size.

The loss curves are saved (JSON) and plotted (PNG). On the GPU machine:

    PYTHONPATH=$PWD python benchmarks/train_qwen3_next_layer.py --out benchmarks/results/train_qwen3_next
    python benchmarks/train_qwen3_next_layer.py --smoke      # tiny, CPU, a few steps: the script runs
"""
from __future__ import annotations

import argparse
import inspect
import json
import time

import torch
import torch.nn.functional as F

import recurscan


def layer_module():
    from transformers.models.qwen3_next import modeling_qwen3_next
    return modeling_qwen3_next


def recurscan_chunk(query, key, value, g, beta, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=False, cu_seqlens=None, **unused):
    """transformers' torch_chunk_gated_delta_rule's signature, on recurscan's op."""
    return recurscan.chunk_gated_delta_rule(query, key, value, g=g, beta=beta, initial_state=initial_state,
                                            output_final_state=output_final_state,
                                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)


class TinyLM(torch.nn.Module):
    """Embedding, one mixer layer (``make_mixer()``, made after the embedding so that a seed gives the
    same weights as before) with a residual, RMS norm, LM head."""

    def __init__(self, make_mixer, hidden, vocab):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.mixer = make_mixer()
        self.norm = torch.nn.RMSNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.mixer(h)
        return self.head(self.norm(h))


def copy_batches(steps, batch, length, vocab, seed):
    """Token sequences whose second half repeats the first: the model must carry the first half in
    its state to predict the second."""
    gen = torch.Generator().manual_seed(seed)
    half = length // 2
    out = []
    for _ in range(steps):
        first = torch.randint(1, vocab, (batch, half), generator=gen)
        out.append(torch.cat([first, first], dim=1))
    return out


def fit(model, batches, steps, device, lr, vocab):
    """AdamW on the copy task's batches: (losses, seconds a step). Shared with the Mamba2 run."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses, times = [], []
    for step in range(steps):
        tokens = batches[step].to(device)
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        half = tokens.shape[1] // 2
        # the loss of the copied half: predicting token t + 1 from tokens <= t
        loss = F.cross_entropy(logits[:, half - 1:].float().reshape(-1, vocab), tokens[:, half:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def fit_with(module, name, recurscan_fn, kind, model, batches, steps, device, lr, vocab):
    """:func:`fit` with ``module.name`` (the layer's recurrence) replaced for the run: by
    ``recurscan_fn`` where kind is "recurscan", else by the layer's own PyTorch path (transformers
    wraps it to dispatch to a hub kernel where one imports: unwrapped here)."""
    original = getattr(module, name)
    setattr(module, name, recurscan_fn if kind == "recurscan" else inspect.unwrap(original))
    try:
        return fit(model, batches, steps, device, lr, vocab)
    finally:
        setattr(module, name, original)


def training_arguments(description):
    """The options both training runs take (the model's sizes are each script's)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=None, help="path prefix of the .json and .png")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, 3 steps")
    return ap


def run_all(train, config, args, device):
    """The three runs (the torch path in float32 and bf16, recurscan's in bf16) of ``train`` on the
    same batches, each printed as it ends; returns them and the record's run fields."""
    batches = copy_batches(args.steps, args.batch, args.length, args.vocab, args.seed)
    runs = {}
    for kind in ("torch", "torch_bf16", "recurscan"):
        losses, times = train(kind, config, args.vocab, batches, args.steps, device, args.lr, args.seed)
        runs[kind] = dict(losses=losses, step_seconds=times)
        print(f"{kind:<10} loss {losses[0]:.4f} -> {losses[-1]:.4f}   median step "
              f"{sorted(times)[len(times) // 2] * 1e3:.1f} ms", flush=True)
    fields = dict(steps=args.steps, batch=args.batch, length=args.length, vocab=args.vocab, lr=args.lr,
                  device=str(device))
    return runs, fields


def report(runs, record, out, title, recurscan_label):
    """Print each bf16 run's distance from the float32 one; save the JSON and the plot under ``out``."""
    def distance(kind):  # from the float32 run: the largest and the mean |loss difference|
        d = [abs(a - b) for a, b in zip(runs[kind]["losses"], runs["torch"]["losses"])]
        return dict(max=max(d), mean=sum(d) / len(d))
    distances = {kind: distance(kind) for kind in ("torch_bf16", "recurscan")}
    for kind, d in distances.items():
        print(f"{kind:<10} |loss - float32 loss|: max {d['max']:.4f}, mean {d['mean']:.4f}")
    if out:
        json.dump(dict(record, runs=runs, distance_from_float32=distances), open(out + ".json", "w"), indent=1)
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(runs["torch"]["losses"], label="transformers' torch path, float32")
        ax.plot(runs["torch_bf16"]["losses"], label="transformers' torch path, bf16", linestyle=":")
        ax.plot(runs["recurscan"]["losses"], label=recurscan_label, linestyle="--")
        ax.set_xlabel("step (AdamW)")
        ax.set_ylabel("copy-task loss")
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out + ".png", dpi=120)


def train(kind, config, vocab, batches, steps, device, lr, seed):
    m = layer_module()
    torch.manual_seed(seed)
    model = TinyLM(lambda: m.Qwen3NextGatedDeltaNet(config, layer_idx=0), config.hidden_size, vocab)
    dtype = torch.float32 if kind == "torch" else torch.bfloat16
    model = model.to(device=device, dtype=dtype)
    return fit_with(m, "torch_chunk_gated_delta_rule", recurscan_chunk, kind, model, batches, steps, device, lr, vocab)


def main():
    ap = training_arguments(__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    args = ap.parse_args()
    from transformers import Qwen3NextConfig
    if args.smoke:
        args.steps, args.batch, args.length, args.vocab, args.hidden = 3, 2, 64, 32, 64
        config = Qwen3NextConfig(hidden_size=64, linear_num_value_heads=4, linear_num_key_heads=2,
                                 linear_key_head_dim=16, linear_value_head_dim=16)
    else:
        config = Qwen3NextConfig(hidden_size=args.hidden)  # Qwen3-Next's linear-attention head sizes
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    runs, fields = run_all(train, config, args, device)
    record = dict(config=dict(hidden=config.hidden_size, value_heads=config.linear_num_value_heads,
                              key_heads=config.linear_num_key_heads, head_k=config.linear_key_head_dim,
                              head_v=config.linear_value_head_dim), **fields)
    report(runs, record, args.out, "Qwen3-Next GatedDeltaNet layer", "recurscan, bf16")

if __name__ == "__main__":
    main()
