"""A training run of the Mamba2 mixer (issue 20): transformers' Mamba2Mixer in a small language
model, trained with AdamW on a synthetic copy task, three times from the same initial weights and
batches:

- ``torch``: the mixer's own PyTorch path, model in float32;
- ``torch_bf16``: the same in bf16: the noise band (bf16 alone moves the curve this far);
- ``recurscan``: the mixer's ``mamba2_chunk_scan`` replaced by ``recurscan.mamba_chunk_scan_combined``
  on the Triton path (forward and backward), model in bf16.

The loss curves are saved (JSON) and plotted (PNG). On the GPU machine:

    PYTHONPATH=$PWD python benchmarks/train_mamba2_mixer.py --out benchmarks/results/train_mamba2_mixer
    python benchmarks/train_mamba2_mixer.py --smoke      # tiny, CPU (interpreter), a few steps
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # the Triton kernels run on CPU tensors under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import recurscan  # noqa: E402
from benchmarks.train_qwen3_next_layer import TinyLM, fit_with, report, run_all, training_arguments  # noqa: E402


def mixer_module():
    from transformers.models.mamba2 import modeling_mamba2
    return modeling_mamba2


def recurscan_chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                         dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, seq_idx=None,
                         **unused):
    """transformers' mamba2_chunk_scan signature, on recurscan's op (Triton path)."""
    return recurscan.mamba_chunk_scan_combined(hidden_states, dt, A, B, C, chunk_size=chunk_size, D=D,
                                               dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx,
                                               dt_softplus=dt_softplus, dt_limit=tuple(dt_limit),
                                               return_final_states=return_final_states, backend="triton")


def train(kind, config, vocab, batches, steps, device, lr, seed):
    m = mixer_module()
    torch.manual_seed(seed)
    model = TinyLM(lambda: m.Mamba2Mixer(config, layer_idx=0), config.hidden_size, vocab)
    model = model.to(device=device, dtype=torch.float32 if kind == "torch" else torch.bfloat16)
    model.train()
    return fit_with(m, "mamba2_chunk_scan", recurscan_chunk_scan, kind, model, batches, steps, device, lr, vocab)


def main():
    args = training_arguments(__doc__.split("\n\n")[0]).parse_args()
    from transformers import Mamba2Config
    if args.smoke:
        args.steps, args.batch, args.length, args.vocab = 3, 2, 64, 32
        config = Mamba2Config(hidden_size=64, num_heads=8, head_dim=16, state_size=16, n_groups=2, expand=2,
                              chunk_size=32)
    else:  # Mamba2-130m's mixer sizes: 24 heads x 64, dstate 128, one group
        config = Mamba2Config(hidden_size=768, num_heads=24, head_dim=64, state_size=128, n_groups=1, expand=2,
                              chunk_size=256)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    runs, fields = run_all(train, config, args, device)
    record = dict(config=dict(hidden=config.hidden_size, heads=config.num_heads, head_dim=config.head_dim,
                              state_size=config.state_size, groups=config.n_groups), **fields)
    report(runs, record, args.out, "Mamba2 mixer", "recurscan Triton, bf16")

if __name__ == "__main__":
    main()
