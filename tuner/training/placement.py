"""Where a model trains and in what precision: `train.device` and `train.precision`.

`train.device: auto` trains on the first CUDA GPU PyTorch sees, else on the CPU; `cpu`, `cuda`
and `cuda:N` choose. `train.precision` is fp32 (no autocast: the CPU path as it always was),
bf16 (autocast; on a CPU only with native bf16 instructions, which emulated bf16 would make
slower than fp32) or fp16 (autocast with a gradient scaler, CUDA only: fp16 gradients
underflow without one). Both are checked at start-up, before anything trains.

A model trains on its device and comes back to the CPU afterwards; deployment then puts it
where `deploy.device` says. Batches go to the device one at a time from pinned memory,
without blocking the host; validation logits come back to the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.data import Batch
from tuner.devices import resolve_device
from tuner.errors import ConfigError, TrialFailed
from tuner.latency import native_bf16_unavailable
from tuner.registry import Registry

DEVICE_KEY = "train.device"
PRECISION_KEY = "train.precision"


@dataclass(frozen=True)
class TrainPrecision:
    """Attributes:
    autocast_dtype: what autocast computes matmuls and convolutions in; None for no autocast.
    scaled: gradients go through a gradient scaler (fp16's range is too narrow for them).
    unsupported_on: device -> why this precision cannot train there, or None.
    """

    autocast_dtype: torch.dtype | None
    scaled: bool
    unsupported_on: Callable[[torch.device], str | None]


TRAIN_PRECISIONS: Registry[TrainPrecision] = Registry(PRECISION_KEY)


def _bf16_unsupported(device: torch.device) -> str | None:
    if device.type == "cpu":
        return native_bf16_unavailable()
    if not torch.cuda.is_bf16_supported():
        return f"{torch.cuda.get_device_name(device)} has no bf16 support"
    return None


def _fp16_unsupported(device: torch.device) -> str | None:
    if device.type == "cpu":
        return "fp16 training needs a CUDA device (train.device); use bf16 or fp32 on a CPU"
    return None


TRAIN_PRECISIONS.register("fp32")(TrainPrecision(None, False, lambda device: None))
TRAIN_PRECISIONS.register("bf16")(TrainPrecision(torch.bfloat16, False, _bf16_unsupported))
TRAIN_PRECISIONS.register("fp16")(TrainPrecision(torch.float16, True, _fp16_unsupported))


@dataclass(frozen=True)
class Placement:
    device: torch.device
    precision: TrainPrecision

    @classmethod
    def of(cls, train_cfg: DictConfig) -> Placement:
        """The `train` node's device and precision, checked against this machine."""
        device = resolve_device(str(train_cfg.device), DEVICE_KEY, allow_auto=True)
        name = str(train_cfg.precision)
        precision = TRAIN_PRECISIONS.get(name)
        reason = precision.unsupported_on(device)
        if reason:
            raise ConfigError(
                f"Invalid config: key '{PRECISION_KEY}': {name!r} cannot train on {device}: "
                f"{reason}"
            )
        return cls(device, precision)

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    def batch(self, batch: Batch) -> Batch:
        """The batch's inputs and labels on the device (its index stays with the data)."""
        if not self.on_cuda:
            return batch
        return Batch(
            tuple(self._moved(tensor) for tensor in batch.inputs),
            self._moved(batch.labels),
            batch.index,
        )

    def _moved(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def autocast(self) -> AbstractContextManager[object]:
        dtype = self.precision.autocast_dtype
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device.type) if self.precision.scaled else None

    def logits_of(self, model: nn.Module) -> Callable[..., torch.Tensor]:
        """The model as a callable taking CPU inputs and giving CPU logits, for evaluation."""
        if not self.on_cuda:
            return model

        def logits_of(*inputs: torch.Tensor) -> torch.Tensor:
            with self.autocast():
                return model(*(self._moved(tensor) for tensor in inputs)).float().cpu()

        return logits_of

    def peak_memory_mb(self) -> float | None:
        """The most GPU memory tensors held since the models came to the device; None on a
        CPU."""
        if not self.on_cuda:
            return None
        return torch.cuda.max_memory_allocated(self.device) / 2**20

    @contextmanager
    def holding(self, *models: nn.Module, batch_size: int) -> Iterator[None]:
        """The models on the device while training runs, back on the CPU afterwards, also when
        training fails; a CUDA out-of-memory error fails the trial naming the batch size, with
        the memory it held given back."""
        if not self.on_cuda:
            yield
            return
        try:
            for model in models:
                model.to(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
        except torch.cuda.OutOfMemoryError as exc:
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            raise TrialFailed(
                f"CUDA out of memory on {self.device} training with train.batch_size="
                f"{batch_size}: {first_line}"
            ) from None
        finally:
            for model in models:
                model.to("cpu")
            torch.cuda.empty_cache()
