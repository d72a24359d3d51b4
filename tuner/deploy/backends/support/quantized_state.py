"""A quantised model's state dict as a safetensors file, which holds plain tensors only.

The state of torch's quantised modules is not all plain tensors: weights are quantised tensors
(integers with a scale and zero point, one per tensor or per output channel), packed Linear
parameters are a tuple (weight, bias or None) beside their dtype. Each quantised tensor is
stored as its integers, its per-channel scales and zero points as tensors beside them; the rest
of the structure (which key holds what, per-tensor scales, dtypes) and the modules' state
versions, by which quantised modules read their state, are JSON in the file's metadata.
Reading it back parses JSON and tensors, so loading runs no code.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

LAYOUT_KEY = "tuner.state_layout"
VERSIONS_KEY = "tuner.state_versions"


def save_state(state: dict[str, Any], path: Path, metadata: dict[str, str]) -> Path:
    """Write `state` (a quantised module's state dict) with `metadata` beside it."""
    tensors: dict[str, torch.Tensor] = {}
    layout = {key: _flatten(key, value, tensors) for key, value in state.items()}
    # Without its version a quantised Linear reads its state in an older layout, and fails.
    versions = dict(getattr(state, "_metadata", {}))
    structure = {LAYOUT_KEY: json.dumps(layout), VERSIONS_KEY: json.dumps(versions)}
    save_file(tensors, str(path), metadata={**metadata, **structure})
    return path


def load_state(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The state dict written by `save_state`, and the metadata written with it."""
    with safe_open(str(path), framework="pt") as stored:
        metadata = dict(stored.metadata())
        tensors = {key: stored.get_tensor(key) for key in stored.keys()}
    layout = json.loads(metadata.pop(LAYOUT_KEY))
    state = OrderedDict((key, _unflatten(key, spec, tensors)) for key, spec in layout.items())
    state._metadata = OrderedDict(json.loads(metadata.pop(VERSIONS_KEY)))  # type: ignore[attr-defined]
    return state, metadata


def _flatten(key: str, value: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Store `value`'s tensors in `tensors` under names derived from `key`; returns the JSON
    spec that rebuilds it."""
    if value is None:
        return {"kind": "none"}
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "dtype": _dtype_name(value)}
    if isinstance(value, tuple | list):
        return {
            "kind": "tuple",
            "items": [_flatten(f"{key}#{i}", item, tensors) for i, item in enumerate(value)],
        }
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{key}: {type(value).__name__} has no safetensors form")
    if not value.is_quantized:
        # A copy: safetensors refuses tensors that share memory, which a state dict may hold.
        tensors[key] = value.detach().clone().contiguous()
        return {"kind": "tensor"}
    tensors[key] = value.int_repr().contiguous()
    if value.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return {"kind": "qtensor", "scale": value.q_scale(), "zero_point": value.q_zero_point()}
    tensors[f"{key}#scales"] = value.q_per_channel_scales().contiguous()
    tensors[f"{key}#zero_points"] = value.q_per_channel_zero_points().contiguous()
    return {"kind": "qchannels", "axis": value.q_per_channel_axis()}


def _unflatten(key: str, spec: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    kind = spec["kind"]
    if kind == "none":
        return None
    if kind == "dtype":
        return _dtype(spec["dtype"])
    if kind == "tuple":
        return tuple(
            _unflatten(f"{key}#{i}", item, tensors) for i, item in enumerate(spec["items"])
        )
    if kind == "tensor":
        return tensors[key]
    if kind == "qtensor":
        return torch._make_per_tensor_quantized_tensor(
            tensors[key], spec["scale"], spec["zero_point"]
        )
    if kind == "qchannels":
        return torch._make_per_channel_quantized_tensor(
            tensors[key], tensors[f"{key}#scales"], tensors[f"{key}#zero_points"], spec["axis"]
        )
    raise ValueError(f"{key}: unknown kind {kind!r} in a quantised state file")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    """The torch dtype named `name`, looked up, never evaluated."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype
