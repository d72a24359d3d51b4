"""The training loop: one screen, no framework."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.data import Encoded
from tuner.devices import describe
from tuner.errors import TrialFailed
from tuner.training.evaluation import accuracy, collect_logits
from tuner.training.mixing import BatchLoss
from tuner.training.optim import build_optimizer
from tuner.training.placement import Placement

if TYPE_CHECKING:
    from tuner.training.distill import Distillation

# Model inputs -> logits: the eager model, or any backend's loaded artifact.


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    train_loss: float
    val_accuracy: float


@dataclass
class TrainResult:
    epochs: list[EpochResult] = field(default_factory=list)
    seconds: float = 0.0
    # Where it trained (`Placement.describe`), and on a GPU the most memory it held there.
    trained_on: str = "cpu"
    gpu_peak_mb: float | None = None
    # The trained model's validation logits, kept so deployment need not compute them again.
    val_logits: torch.Tensor | None = None

    @property
    def val_accuracy(self) -> float:
        return self.epochs[-1].val_accuracy

    def summary(self) -> dict[str, Any]:
        """How the model trained, as JSON can hold it (the validation logits left out)."""
        return {
            "epochs": [asdict(epoch) for epoch in self.epochs],
            "seconds": self.seconds,
            "trained_on": self.trained_on,
            "gpu_peak_mb": self.gpu_peak_mb,
        }

    @classmethod
    def of_summary(cls, summary: Mapping[str, Any]) -> TrainResult:
        return cls(
            epochs=[EpochResult(**epoch) for epoch in summary["epochs"]],
            seconds=float(summary["seconds"]),
            trained_on=str(summary["trained_on"]),
            gpu_peak_mb=summary["gpu_peak_mb"],
        )


def _linear_warmup_decay(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    warmup = max(int(total_steps * warmup_ratio), 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(total_steps - warmup, 1))

    return factor


def train(
    model: nn.Module,
    train_data: Encoded,
    val_data: Encoded,
    cfg: DictConfig,
    batch_loss: BatchLoss,
    on_step: Callable[[int, int, float], None] = lambda done, total, loss: None,
    on_epoch: Callable[[EpochResult], None] = lambda result: None,
    distillation: Distillation | None = None,
) -> TrainResult:
    """Train `model` with the knobs in `cfg` (the `train` node) and the modality's batch loss
    (`tuner.training.mixing`), learning from a teacher too when `distillation` is given; fail
    the trial on NaN/Inf loss."""
    placement = Placement.of(cfg)
    teacher = () if distillation is None else (distillation.teacher,)
    with placement.holding(model, *teacher, batch_size=int(cfg.batch_size)):
        return _train_placed(
            model, train_data, val_data, cfg, batch_loss, on_step, on_epoch, distillation, placement
        )


def validation_logits(model: nn.Module, val_data: Encoded, cfg: DictConfig) -> torch.Tensor:
    """A trained model's validation logits, computed where and as training's last epoch
    computes them (`cfg` is the `train` node it trained with)."""
    placement = Placement.of(cfg)
    with placement.holding(model, batch_size=int(cfg.batch_size)):
        model.eval()
        return collect_logits(placement.logits_of(model), val_data)


def _train_placed(
    model: nn.Module,
    train_data: Encoded,
    val_data: Encoded,
    cfg: DictConfig,
    batch_loss: BatchLoss,
    on_step: Callable[[int, int, float], None],
    on_epoch: Callable[[EpochResult], None],
    distillation: Distillation | None,
    placement: Placement,
) -> TrainResult:
    """The training loop, with the model (and teacher) already on the placement's device."""
    generator = torch.Generator().manual_seed(int(cfg.seed))
    optimizer = build_optimizer(model, cfg.optimizer, float(cfg.lr), float(cfg.weight_decay))
    scaler = placement.scaler()
    batch_size = int(cfg.batch_size)
    # A trailing batch of one example is skipped: batch norm cannot normalise a single example.
    skip_single = batch_size > 1 and len(train_data) % batch_size == 1
    steps_per_epoch = -(-len(train_data) // batch_size) - int(skip_single)
    total_steps = steps_per_epoch * int(cfg.epochs)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _linear_warmup_decay(total_steps, float(cfg.warmup_ratio))
    )
    result = TrainResult(trained_on=describe(placement.device))
    started, step = time.perf_counter(), 0
    # The teacher watches the student's layers while it trains, never afterwards.
    teaching = distillation.teaching(model) if distillation is not None else nullcontext()
    with teaching:
        for epoch in range(1, int(cfg.epochs) + 1):
            model.train()
            loss_sum = 0.0
            for batch in train_data.batches(batch_size, generator, bool(cfg.group_by_length)):
                if skip_single and len(batch.labels) == 1:
                    continue
                batch = placement.batch(batch)
                with placement.autocast():
                    output = batch_loss(model, batch, generator)
                    loss = output.loss if distillation is None else distillation.loss(output, batch)
                if not math.isfinite(loss.item()):
                    raise TrialFailed(
                        f"train_loss became {loss.item()} at epoch {epoch}, step {step + 1}"
                    )
                optimizer.zero_grad(set_to_none=True)
                _step(model, loss, optimizer, scaler, float(cfg.grad_clip_norm))
                schedule.step()
                loss_sum += loss.item()
                step += 1
                # The epoch's mean training loss so far.
                on_step(step, total_steps, loss_sum / (step - (epoch - 1) * steps_per_epoch))
            model.eval()
            result.val_logits = collect_logits(placement.logits_of(model), val_data)
            epoch_result = EpochResult(
                epoch, loss_sum / steps_per_epoch, accuracy(result.val_logits, val_data.labels)
            )
            result.epochs.append(epoch_result)
            on_epoch(epoch_result)
    result.seconds = time.perf_counter() - started
    result.gpu_peak_mb = placement.peak_memory_mb()
    return result


def _step(
    model: nn.Module,
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    grad_clip_norm: float,
) -> None:
    """Backward, clipping by global norm (of the true gradients: a scaler's are unscaled
    first) and the optimizer's step, which a scaler skips where gradients overflowed."""
    if scaler is None:
        loss.backward()
        if grad_clip_norm > 0:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip_norm)
        optimizer.step()
        return
    scaler.scale(loss).backward()
    if grad_clip_norm > 0:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip_norm)
    scaler.step(optimizer)
    scaler.update()
