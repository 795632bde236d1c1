"""The training layer's room: a ``torch.autograd.Function`` per op, between the public ops and the
launches (ops -> autograd -> launch). Empty until the backward stages land (the delta-rule
backward, then the SSD/GLA engine); today the Triton paths are forward-only and refuse inputs that
require grad, and CPU tensors are differentiated through the oracle by PyTorch's autograd."""
