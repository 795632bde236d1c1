"""What several test modules share: the oracle tolerances (:mod:`.tolerances`), the input builders
(:mod:`.inputs`), and the delta-rule launches built from the old keyword style (:mod:`.launches`,
which imports triton: imported only by the tests that launch the kernels directly), and the
offline sm_90 compile of the backward's launches (:mod:`.sm90`, run in a process of its own)."""
