"""Triton kernels. They run on CUDA tensors, and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1`` set before triton is first imported); they never import the public ops.

- ``chunk_delta``: chunked prefill of the delta-rule family (Gated DeltaNet = Gated Delta Product
  with M = 1): a prep kernel (gates, gate-free WY inverse, gated and stored) and a sweep kernel
  (state across chunks, outputs, chunk and final states). See docs/kernels-chunk-delta.md.
- ``recurrent``: the streaming (decode) kernel.
"""


def launch_key(tensors) -> tuple:
    """Everything Triton specializes a launch on, per tensor: shape, strides, dtype, device and
    16-byte alignment. Calls with equal keys can share validation, launch arguments and compiled
    kernel. Kept here, beside no Triton import, so the ops can key their caches without triton."""
    # a list comprehension, then one tuple: cheaper than a generator (this runs on every call)
    return tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15 == 0)
                  for t in tensors])


def key_contiguous(state) -> bool:
    """Whether a ``[.., K, V]`` state tensor is a transposed view of a ``[.., V, K]`` one (key rows
    contiguous: the layout of vLLM's, SGLang's and FlashInfer's caches, and of fla's
    ``state_v_first``). The streaming kernel's launch rule gives such states key-contiguous tiles,
    and the decode op lays out a new final state like its initial state by it."""
    return state is not None and state.shape[-2] > 1 and state.stride(-2) == 1 and state.stride(-1) != 1
