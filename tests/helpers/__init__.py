"""What several test modules share: the oracle tolerances (:mod:`.tolerances`), the input builders
(:mod:`.inputs`), and the delta-rule launches built from the old keyword style (:mod:`.launches`,
which imports triton: imported only by the tests that launch the kernels directly)."""
