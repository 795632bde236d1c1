"""The CPU oracle: for every family, a naive token loop (the ground truth) and the chunked form
(one chunk window at a time). Pure PyTorch; never imports Triton or the kernels."""
