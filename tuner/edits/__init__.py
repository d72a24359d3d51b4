"""Structural edits: functions over a built model, each driven by one `model.*` config key."""

from __future__ import annotations

from tuner.edits.base import (
    EDITS,
    SAME_EDIT,
    Edit,
    apply_edits,
    architecture_of,
    edit_keys,
    resolved_edits,
)

# Importing the modules registers their edits.
from tuner.edits import depth, ffn_width, heads  # noqa: E402,F401  isort: skip

from tuner.edits.depth import find_layer_stack
from tuner.edits.heads import attention_heads, find_self_attentions, kept_heads

__all__ = [
    "EDITS",
    "Edit",
    "SAME_EDIT",
    "apply_edits",
    "architecture_of",
    "attention_heads",
    "edit_keys",
    "find_layer_stack",
    "find_self_attentions",
    "kept_heads",
    "resolved_edits",
]
