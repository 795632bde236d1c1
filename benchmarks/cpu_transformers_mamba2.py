"""A real client of the SSD ops: transformers' Mamba2 model, or the hybrid Bamba (attention and
Mamba2 layers), tiny, float32, generating greedily with its own PyTorch path, then with recurscan's
``mamba_chunk_scan_combined`` (prefill) and ``selective_state_update`` (each generated token) in
place of it: the tokens must be identical and the logits close. ``--backend triton`` runs the
chunked prefill on the GLA kernel (under the Triton interpreter on a CPU). Exits 1 where they
differ.

    python -m benchmarks.cpu_transformers_mamba2 [--model mamba2|bamba] [--backend torch|triton] [--out FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch

if not torch.cuda.is_available():  # the Triton kernels run on CPU tensors under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import recurscan  # noqa: E402


def model_and_prompt(name="mamba2", seed=0):
    """(model, prompt, the transformers module whose Mamba2 functions the model calls)."""
    torch.manual_seed(seed)
    if name == "bamba":
        from transformers import BambaConfig, BambaForCausalLM
        from transformers.models.bamba import modeling_bamba as module
        config = BambaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=3, attn_layer_indices=[1],
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, mamba_n_heads=8,
                             mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2, mamba_expand=2,
                             mamba_chunk_size=32, mamba_d_conv=4)
        model = BambaForCausalLM(config)
    else:
        from transformers import Mamba2Config, Mamba2ForCausalLM
        from transformers.models.mamba2 import modeling_mamba2 as module
        config = Mamba2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
                              state_size=16, n_groups=2, expand=2, chunk_size=32, conv_kernel=4)
        model = Mamba2ForCausalLM(config)
    # At init the mixers' B, C and x are small and D is 1, so y = h C + D x is nearly D x and the
    # recurrence barely shows in the logits; wider input projections and D = 0.1 make it carry
    # them (scan_share).
    with torch.no_grad():
        for mixer in model.modules():
            if hasattr(mixer, "in_proj") and hasattr(mixer, "A_log"):
                mixer.in_proj.weight.normal_(0.0, 0.3)
                mixer.D.fill_(0.1)
    prompt = torch.randint(0, config.vocab_size, (2, 45))
    return model.float().eval(), prompt, module


def scan_share(model, prompt, module):
    """||h C|| / ||h C + D x|| of the first prefill scan: how much of the mixer's output the
    recurrence carries (the rest is the D skip)."""
    captured = []
    original = module.mamba2_chunk_scan

    def capture(*args, **kwargs):
        out = original(*args, **kwargs)
        captured.append((args, kwargs, out[0] if isinstance(out, tuple) else out))
        return out

    module.mamba2_chunk_scan = capture
    try:
        with torch.no_grad():
            model(prompt)
    finally:
        module.mamba2_chunk_scan = original
    args, kwargs, y = captured[0]
    skip = kwargs["D"][None, None, :, None] * args[0] if kwargs.get("D") is not None else torch.zeros_like(y)
    return ((y - skip).norm() / y.norm()).item()


def generate(model, prompt, steps):
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, torch.stack(out.logits, 1)


@contextlib.contextmanager
def recurscan_in_place(module, backend):
    """transformers' Mamba2 functions in ``module`` (prefill scan and decode update) replaced by
    recurscan's ops while the block runs; yields the count of calls to each."""
    calls = {"chunk_scan": 0, "state_update": 0}

    def chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                   dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, seq_idx=None,
                   **unused):
        calls["chunk_scan"] += 1
        return recurscan.mamba_chunk_scan_combined(hidden_states, dt, A, B, C, chunk_size=chunk_size, D=D,
                                                   dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx,
                                                   dt_softplus=dt_softplus, dt_limit=tuple(dt_limit),
                                                   return_final_states=return_final_states, backend=backend)

    def state_update(state, x, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **unused):
        calls["state_update"] += 1
        return recurscan.selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                                                dt_softplus=dt_softplus)

    originals = module.mamba2_chunk_scan, module.mamba2_selective_state_update
    module.mamba2_chunk_scan, module.mamba2_selective_state_update = chunk_scan, state_update
    try:
        yield calls
    finally:
        module.mamba2_chunk_scan, module.mamba2_selective_state_update = originals


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mamba2", choices=["mamba2", "bamba"])
    ap.add_argument("--backend", default="torch", choices=["torch", "triton"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out")
    args = ap.parse_args()
    model, prompt, m = model_and_prompt(args.model)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, prompt = model.to(device), prompt.to(device)
    share = scan_share(model, prompt, m)
    want_tokens, want_logits = generate(model, prompt, args.steps)
    with recurscan_in_place(m, args.backend) as calls:
        got_tokens, got_logits = generate(model, prompt, args.steps)
    same = torch.equal(got_tokens, want_tokens)
    err = ((got_logits - want_logits).norm() / want_logits.norm()).item()
    record = dict(model=args.model, scan_share=share, backend=args.backend, device=str(device), steps=args.steps, calls=calls, tokens_identical=same,
                  logits_relative_error=err)
    print(json.dumps(record))
    if args.out:
        json.dump(record, open(args.out, "w"), indent=1)
    if not same or err > 1e-4 or not calls["chunk_scan"] or not calls["state_update"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
