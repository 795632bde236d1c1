"""The chunked delta rule's launches from keyword arguments in the style of the former
``plan_chunk_delta(..., block_v=16, segments=3)``: the :class:`recurscan.plan.DeltaShape` fields
among them replace those of ``TEST_SHAPE`` (``chunk_delta_fwd``'s default shape), the others go to
:func:`recurscan.launch.delta.build_delta_launches`. Imports triton."""
from __future__ import annotations

import dataclasses

from recurscan.launch.delta import TEST_SHAPE, build_delta_launches
from recurscan.plan import DeltaShape

#: The keyword arguments that are fields of the launch shape.
SHAPE_FIELDS = frozenset(f.name for f in dataclasses.fields(DeltaShape))


def shape_with(**fields) -> DeltaShape:
    """TEST_SHAPE with ``fields`` replaced (not validated here: build_delta_launches checks it)."""
    return dataclasses.replace(TEST_SHAPE, **fields)


def delta_launches(q, k, v, g, beta, **kw):
    """``build_delta_launches(q, k, v, g, beta, shape_with(**shape fields of kw), **the rest of kw)``."""
    fields = {name: kw.pop(name) for name in list(kw) if name in SHAPE_FIELDS}
    return build_delta_launches(q, k, v, g, beta, shape_with(**fields), **kw)
