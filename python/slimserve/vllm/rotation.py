"""Hadamard-rotated K (and V) pages: SLIMSERVE_KV_ROTATION=keys or keys_and_values.

The append rotates each K head vector (and, with keys_and_values, each V head vector) by the
normalized Walsh-Hadamard transform H / sqrt(head_size) before it is quantized, which spreads a
vector's outliers over all its elements: what makes 4-bit keys accurate (docs/accuracy.md). The
transform is orthogonal and its own inverse, so attention reads the same pages unchanged with
the queries rotated the same way (q.k is unchanged), and with rotated values the output is
rotated back. In kernel mode the paged attention does both itself (its rotation argument); in
host mode (torch attention) they are slimserve's rotate_heads, launched on the step's stream.
Head sizes 64, 128 and 256.
"""
from __future__ import annotations

import os

ENV = "SLIMSERVE_KV_ROTATION"
MODES = ("none", "keys", "keys_and_values")
HEAD_SIZES = (64, 128, 256)


def mode(head_size: int) -> str:
    """The rotation SLIMSERVE_KV_ROTATION asks for (default none), checked against the layer."""
    from .support import _refuse

    value = os.environ.get(ENV) or "none"
    if value not in MODES:
        raise ValueError(f"slimserve vLLM backend: {ENV}={value!r} is not supported (supported: {', '.join(MODES)})")
    if value != "none" and head_size not in HEAD_SIZES:
        _refuse(f"head size with {ENV}={value}:", head_size, HEAD_SIZES)
    return value
