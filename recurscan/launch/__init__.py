"""Launches built from a Schedule: named argument records, buffers, grids and launch sequences.
No decisions (the planner made them): ``delta`` for the chunked delta rule, ``stream`` for the
streaming kernel. Imported on the Triton path only (it imports triton)."""
