"""Start-up checks of config values, including every value a search space can sample.

Each rule names a dotted key; the value checked is the config's, or when the key is searched,
each choice or both bounds of its range, so a bad space fails before the study exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tuner.config import SearchSpace, candidate_values
from tuner.data import DATA_SOURCES
from tuner.deploy import BACKENDS
from tuner.devices import device_format_ok
from tuner.errors import ConfigError
from tuner.latency import LATENCY_STATISTICS, MACHINE_NAME, MACHINE_NAME_RULE, STATISTIC_KEY
from tuner.models import MODEL_FAMILIES
from tuner.registry import Registry
from tuner.study.samplers import SAMPLERS
from tuner.training import INIT_SCHEMES, OPTIMIZERS, TRAIN_PRECISIONS, Placement
from tuner.trial import START_POINTS

REGISTRY_KEYS: dict[str, Registry[Any]] = {
    "data.source": DATA_SOURCES,
    "model.family": MODEL_FAMILIES,
    "train.optimizer": OPTIMIZERS,
    "train.init": INIT_SCHEMES,
    "train.precision": TRAIN_PRECISIONS,
    "deploy.backend": BACKENDS,
    "study.sampler": SAMPLERS,
    STATISTIC_KEY: LATENCY_STATISTICS,
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


Rule = tuple[Callable[[Any], bool], str]
POSITIVE: Rule = (lambda v: _number(v) and v > 0, "must be a number > 0")
NON_NEGATIVE: Rule = (lambda v: _number(v) and v >= 0, "must be a number >= 0 (0 turns it off)")
POSITIVE_INT: Rule = (_positive_int, "must be an int >= 1")
NON_NEGATIVE_INT: Rule = (lambda v: _positive_int(v) or v == 0, "must be an int >= 0")
FRACTION: Rule = (lambda v: _number(v) and 0 <= v < 1, "must be in [0, 1)")
BOOLEAN: Rule = (lambda v: isinstance(v, bool), "must be true or false")
OPTIONAL_NON_NEGATIVE: Rule = (
    lambda v: v is None or (_number(v) and v >= 0),
    "must be a number >= 0, or null for no limit",
)

OPTIONAL_POSITIVE_INT: Rule = (
    lambda v: v is None or _positive_int(v),
    "must be an int >= 1, or null to keep the architecture's own",
)
OPTIONAL_SCALE: Rule = (
    lambda v: v is None or (_number(v) and v > 0),
    "must be a number > 0, or null to keep the architecture's own",
)
OPTIONAL_POSITIVE: Rule = (
    lambda v: v is None or (_number(v) and v > 0),
    "must be a number > 0, or null to fix it from the first trial",
)
MACHINE: Rule = (
    lambda v: v is None or (isinstance(v, str) and bool(MACHINE_NAME.match(v))),
    f"{MACHINE_NAME_RULE}, or null",
)

VALUE_RULES: dict[str, Rule] = {
    "train.lr": POSITIVE,
    "train.weight_decay": NON_NEGATIVE,
    "train.grad_clip_norm": NON_NEGATIVE,
    "train.mixup_alpha": NON_NEGATIVE,
    "train.cutmix_alpha": NON_NEGATIVE,
    "train.epochs": POSITIVE_INT,
    "train.batch_size": POSITIVE_INT,
    "train.warmup_ratio": FRACTION,
    "train.group_by_length": BOOLEAN,
    "train.device": (
        lambda v: device_format_ok(v, allow_auto=True),
        "must be auto, cpu, cuda or cuda:N",
    ),
    "train.distill.alpha": (
        lambda v: _number(v) and 0 <= v <= 1,
        "must be a weight in [0, 1] (0 turns distillation off)",
    ),
    "train.distill.temperature": POSITIVE,
    "train.distill.hidden_weight": NON_NEGATIVE,
    "train.distill.start_from": (
        lambda v: v in START_POINTS,
        "must be " + " or ".join(START_POINTS),
    ),
    "train.distill.teacher": (
        lambda v: (
            (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
            or (isinstance(v, str) and v != "")
        ),
        "must be auto, a trial number of this study, or a stored teacher (runs:/<run id>/"
        "teacher, or a directory)",
    ),
    "data.max_length": POSITIVE_INT,
    "data.drop_empty": BOOLEAN,
    "model.in_chans": POSITIVE_INT,
    "model.width_multiplier": OPTIONAL_SCALE,
    "model.depth": OPTIONAL_POSITIVE_INT,
    "study.n_trials": POSITIVE_INT,
    "study.heartbeat.interval": POSITIVE_INT,
    "study.heartbeat.grace_period": POSITIVE_INT,
    "study.heartbeat.max_retry": NON_NEGATIVE_INT,
    "study.max_accuracy_drop": OPTIONAL_NON_NEGATIVE,
    "study.latency_budget_ms": OPTIONAL_NON_NEGATIVE,
    "study.hypervolume_reference.val_accuracy": FRACTION,
    "study.hypervolume_reference.latency_ms_p50": OPTIONAL_POSITIVE,
    "deploy.onnx.opset": POSITIVE_INT,
    "deploy.onnx.int8.reduce_range": (
        lambda v: v == "auto" or isinstance(v, bool),
        "must be auto, true or false",
    ),
    "deploy.onnx.int8.weight_type": (lambda v: v in ("int8", "uint8"), "must be int8 or uint8"),
    "deploy.onnx.int8.per_channel": BOOLEAN,
    "deploy.onnx.allow_spinning": BOOLEAN,
    "deploy.openvino.precision": (
        lambda v: v in ("auto", "f32", "bf16"),
        "must be auto, f32 or bf16",
    ),
    "deploy.openvino.accuracy_control": BOOLEAN,
    "deploy.device": (device_format_ok, "must be cpu, cuda or cuda:N"),
    "deploy.calibration_samples": POSITIVE_INT,
    "deploy.mixed.min_agreement": (
        lambda v: _number(v) and 0 <= v <= 1,
        "must be a share of predictions in [0, 1]",
    ),
    "deploy.latency.batch_size": POSITIVE_INT,
    "deploy.latency.seq_len": POSITIVE_INT,
    "deploy.latency.num_threads": POSITIVE_INT,
    "deploy.latency.warmup": NON_NEGATIVE_INT,
    "deploy.latency.repeats": POSITIVE_INT,
    "deploy.latency.rounds": POSITIVE_INT,
    "deploy.latency.max_rounds": POSITIVE_INT,
    "deploy.latency.front_sessions": POSITIVE_INT,
    "deploy.latency.steady_within": (
        lambda v: v is None or (_number(v) and v > 0),
        "must be a number > 0 (a fraction of the reference's fastest reading), or null to "
        "count every round",
    ),
    "deploy.latency.steady_attempts": POSITIVE_INT,
    "deploy.latency.steady_wait_s": NON_NEGATIVE,
    "deploy.machine": MACHINE,
    "deploy.agreement_tolerance": (
        lambda v: _number(v) and 0 <= v <= 1,
        "must be a share of predictions in [0, 1]",
    ),
    "study.target_machine": MACHINE,
    "study.target_wait_s": POSITIVE,
    "study.pruning.enabled": BOOLEAN,
    "study.pruning.min_epochs": POSITIVE_INT,
    "study.pruning.margin": NON_NEGATIVE,
    "study.pruning.n_startup_trials": POSITIVE_INT,
}


_ABSENT = object()


def _values(cfg: DictConfig, space: SearchSpace, key: str) -> tuple[list[Any], str]:
    """The values to check; none for a key the config lacks (keys of one model family or
    modality, such as `data.max_length` or `model.depth`, are absent from the others)."""
    if key in space.distributions:
        return candidate_values(space.distributions[key]), " (a value of its search space)"
    value = OmegaConf.select(cfg, key, default=_ABSENT)
    return ([] if value is _ABSENT else [value]), ""


def check_config(cfg: DictConfig, space: SearchSpace, sources: Mapping[str, str]) -> None:
    for key, registry in REGISTRY_KEYS.items():
        values, where = _values(cfg, space, key)
        for value in values:
            if value not in registry:
                raise ConfigError(
                    f"Invalid config: key '{key}'{where}: unknown value {value!r}; choose one "
                    f"of {', '.join(registry.names())}" + defined_in(key, sources)
                )
    for key, (valid, rule) in VALUE_RULES.items():
        values, where = _values(cfg, space, key)
        for value in values:
            if not valid(value):
                raise ConfigError(
                    f"Invalid config: key '{key}'{where}: {value!r} {rule}"
                    + defined_in(key, sources)
                )
    _check_heartbeat(cfg)
    _check_rounds(cfg)
    _check_placement(cfg, space)


def _check_placement(cfg: DictConfig, space: SearchSpace) -> None:
    """Every device and precision the study may train with exists on this machine."""
    devices, _ = _values(cfg, space, "train.device")
    precisions, _ = _values(cfg, space, "train.precision")
    for device in devices:
        for precision in precisions:
            Placement.of(OmegaConf.create({"device": device, "precision": precision}))


def _check_rounds(cfg: DictConfig) -> None:
    latency = cfg.deploy.latency
    if latency.get("max_rounds", 1) < latency.get("rounds", 1):
        raise ConfigError(
            f"Invalid config: key 'deploy.latency.max_rounds': {latency.max_rounds} must be at "
            f"least deploy.latency.rounds ({latency.rounds}), the rounds of a first measurement"
        )


def _check_heartbeat(cfg: DictConfig) -> None:
    heartbeat = cfg.study.heartbeat
    if heartbeat.grace_period <= heartbeat.interval:
        raise ConfigError(
            f"Invalid config: key 'study.heartbeat.grace_period': {heartbeat.grace_period} must "
            f"be longer than study.heartbeat.interval ({heartbeat.interval}), or live trials "
            "would be taken for dead ones"
        )


def defined_in(key: str, sources: Mapping[str, str]) -> str:
    """`; defined in FILE` for a search-space key, for error messages."""
    return f"; defined in {sources[key]}" if key in sources else ""
