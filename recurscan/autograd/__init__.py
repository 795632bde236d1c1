"""The training layer: a ``torch.autograd.Function`` per op, between the public ops and the
launches (ops -> autograd -> launch).

- ``cotangents``: what the Functions share: an unread output's cotangent None, made where needed.
- ``delta``: ``ChunkDelta``, the chunked delta rule (GDN, GDP) on the Triton path: the Triton
  forward, and the backward by the Triton stages of ``launch/delta_backward.py`` (GDP as GDN on
  its expanded stream).

CPU tensors on the torch backend are differentiated through the oracle by PyTorch's autograd.
"""
