"""The backends a study deploys on (the backends themselves live in `tuner/deploy/backends/`):
those the config lists, checked against the modality and the deploy device, then narrowed to
those this machine runs, each one left out said once."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from omegaconf import DictConfig, OmegaConf
from optuna.distributions import CategoricalDistribution

from tuner.config import SearchSpace
from tuner.deploy import BACKENDS, openvino_bf16_missing, unavailable_backends
from tuner.devices import resolve_device
from tuner.errors import ConfigError
from tuner.keys import BACKEND_KEY
from tuner.latency import unknown_cpu_notice
from tuner.study import messages
from tuner.study.checks import defined_in

DEPLOY_DEVICE_KEY = "deploy.device"
# The backends every trained model is deployed on, as a list typed on the command line
# (`deploy.backends=[eager,openvino_int8]`), in place of the experiment's `deploy.backend`
# choices, which Hydra's command line cannot address.
BACKENDS_KEY = "deploy.backends"


def backends_typed_win(
    cfg: DictConfig, space: SearchSpace, pinned: Collection[str]
) -> tuple[SearchSpace, str | None]:
    """The search space deploying on `deploy.backends` where it is set, and where the list
    then comes from (for errors); each name must be a backend this machine runs."""
    listed = OmegaConf.select(cfg, BACKENDS_KEY)
    if listed is None:
        return space, None
    names = OmegaConf.to_container(listed) if OmegaConf.is_list(listed) else listed
    example = "e.g. deploy.backends=[eager,openvino_int8]"
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f"Invalid config: key '{BACKENDS_KEY}': {names!r} must be a list of backend "
            f"names, {example}"
        )
    if BACKEND_KEY in pinned:
        raise ConfigError(
            f"Invalid config: keys {BACKEND_KEY} and {BACKENDS_KEY} both name the backends; "
            f"set one ({BACKENDS_KEY} for several)"
        )
    known = set(BACKENDS.names())
    unknown = [name for name in names if name not in known]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if unknown or repeated:
        problem = f"unknown {unknown}" if unknown else f"listed twice {repeated}"
        raise ConfigError(
            f"Invalid config: key '{BACKENDS_KEY}': {problem}; the backends are "
            f"{', '.join(sorted(known))}"
        )
    left_out = unavailable_backends(names)
    if left_out:
        raise ConfigError(
            f"Invalid config: key '{BACKENDS_KEY}': this machine cannot run {described(left_out)}"
        )
    distributions = {**space.distributions, BACKEND_KEY: CategoricalDistribution(names)}
    fixed = {key: value for key, value in space.fixed.items() if key != BACKEND_KEY}
    return replace(space, distributions=distributions, fixed=fixed), BACKENDS_KEY


def deployment_backends(cfg: DictConfig, space: SearchSpace) -> list[str]:
    """Every backend a trained model is deployed on: the searched choices, or the one set."""
    distribution = space.distributions.get(BACKEND_KEY)
    if isinstance(distribution, CategoricalDistribution):
        return [str(choice) for choice in distribution.choices]
    return [str(cfg.deploy.backend)]


def check_backends(
    backends: Sequence[str], modality: str, deploy: DictConfig, sources: Mapping[str, str]
) -> None:
    """Each listed backend deploys the modality's models, on the kind of device the study
    deploys on (`deploy.device`, which must exist here), in a precision this machine has
    (`deploy.openvino.precision`)."""
    deploy_device = str(deploy.device)
    device = resolve_device(deploy_device, DEPLOY_DEVICE_KEY)
    for name in backends:
        backend = BACKENDS.get(name)
        if modality not in backend.modalities:
            raise ConfigError(
                f"Invalid config: key 'deploy.backend': '{name}' deploys "
                f"{' and '.join(sorted(backend.modalities))} models, not {modality} ones"
                + defined_in(BACKEND_KEY, sources)
            )
        if backend.device != device.type:
            raise ConfigError(
                f"Invalid config: key 'deploy.backend': '{name}' deploys on {backend.device}, "
                f"but this study deploys on {device.type} ({DEPLOY_DEVICE_KEY}={deploy_device})"
                + defined_in(BACKEND_KEY, sources)
            )
    _check_openvino_precision(backends, deploy, sources)


def _check_openvino_precision(
    backends: Sequence[str], deploy: DictConfig, sources: Mapping[str, str]
) -> None:
    if str(OmegaConf.select(deploy, "openvino.precision", default="auto")) != "bf16":
        return
    openvino = [name for name in backends if name.startswith("openvino")]
    reason = openvino_bf16_missing() if openvino and not unavailable_backends(openvino) else None
    if reason:
        raise ConfigError(
            f"Invalid config: key 'deploy.openvino.precision': bf16, but {reason}; use auto "
            "(f32 here) or f32" + defined_in("deploy.openvino.precision", sources)
        )


def runnable_backends(
    backends: Sequence[str], sources: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The listed backends this machine can run, and why each other one cannot (one console
    line each). None runnable stops the study before anything is created."""
    notice = unknown_cpu_notice()
    if notice:
        messages.unknown_cpu(notice)
    left_out = unavailable_backends(backends)
    for name, reason in left_out.items():
        messages.backend_left_out(name, reason)
    runnable = [name for name in backends if name not in left_out]
    if not runnable:
        raise ConfigError(
            f"Invalid config: key 'deploy.backend': no listed backend runs on this machine "
            f"({described(left_out)})" + defined_in(BACKEND_KEY, sources)
        )
    return runnable, left_out


def described(reasons: Mapping[str, str]) -> str:
    """Backends with the reason each is left out, on one line."""
    return "; ".join(f"{name}: {reason}" for name, reason in reasons.items())


def deploy_only_on(space: SearchSpace, backends: Sequence[str]) -> SearchSpace:
    """The search space with `deploy.backend` listing the runnable backends only: the
    distribution the backend param of every point is recorded under."""
    if not isinstance(space.distributions.get(BACKEND_KEY), CategoricalDistribution):
        return space
    narrowed = CategoricalDistribution(list(backends))
    return replace(space, distributions={**space.distributions, BACKEND_KEY: narrowed})
