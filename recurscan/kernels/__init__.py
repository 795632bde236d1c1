"""Device code only: Triton kernels, a file per stage, grouped by engine. They run on CUDA tensors,
and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is first
imported); they import nothing from the rest of the package.

- ``delta/``: chunked prefill of the delta-rule family (Gated DeltaNet = Gated Delta Product with
  M = 1): ``prep`` (gates, gate-free WY inverse, gated and stored), ``sweep`` (state across chunks,
  outputs, chunk and final states), ``fixup`` (segments), ``common`` (shared device helpers).
  See docs/kernels-chunk-delta.md.
- ``stream/``: the streaming (token-by-token) kernel of every family (decode). See
  docs/kernels-decode.md.
"""
