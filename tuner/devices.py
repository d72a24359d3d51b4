"""Devices named in the config (`train.device`, `deploy.device`): `cpu`, `cuda`, `cuda:N`, and
for training `auto`; resolved against what this machine has, a GPU it lacks refused with why."""

from __future__ import annotations

import re

import torch

from tuner.errors import ConfigError

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def device_format_ok(value: object, allow_auto: bool = False) -> bool:
    return isinstance(value, str) and (
        bool(_DEVICE.match(value)) or (allow_auto and value == "auto")
    )


def resolve_device(spec: str, key: str, allow_auto: bool = False) -> torch.device:
    """The device `spec` stands for on this machine (`auto`: the first CUDA GPU PyTorch sees,
    else the CPU); a CUDA device this machine does not have is refused, naming `key`."""
    if not device_format_ok(spec, allow_auto):
        choices = "auto, cpu, cuda or cuda:N" if allow_auto else "cpu, cuda or cuda:N"
        raise ConfigError(f"Invalid config: key '{key}': {spec!r} must be {choices}")
    available = torch.cuda.is_available()
    if spec == "auto":
        return torch.device("cuda" if available else "cpu")
    device = torch.device(spec)
    if device.type == "cpu":
        return device
    if not available:
        why = (
            "this PyTorch build has no CUDA support"
            if torch.version.cuda is None
            else "PyTorch sees no CUDA GPU on this machine (no GPU, no driver, or "
            "CUDA_VISIBLE_DEVICES hides them)"
        )
        raise ConfigError(f"Invalid config: key '{key}': {spec!r} asks for a GPU, but {why}")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ConfigError(
            f"Invalid config: key '{key}': {spec!r}: this machine has {count} CUDA GPU(s), "
            "numbered from 0"
        )
    return device


def gpu_index(device: torch.device) -> int:
    """The index of the GPU a CUDA device means (`cuda` alone: the current one)."""
    return torch.cuda.current_device() if device.index is None else device.index


def describe(device: torch.device) -> str:
    """`cpu`, or `cuda:0 (<GPU model>)`."""
    if device.type != "cuda":
        return "cpu"
    index = gpu_index(device)
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
