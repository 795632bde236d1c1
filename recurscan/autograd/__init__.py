"""The training layer: a ``torch.autograd.Function`` per op, between the public ops and the
launches (ops -> autograd -> launch).

- ``delta``: ``ChunkDelta``, the chunked delta rule (GDN, GDP) on the Triton path: the Triton
  forward, the written-out chunkwise backward of ``reference/delta_backward.py`` in PyTorch (the
  Triton backward stages will replace it).

CPU tensors on the torch backend are differentiated through the oracle by PyTorch's autograd.
"""
