"""One latency protocol for every backend: pinned threads, warm-up, interleaved timed rounds.

Shared CPUs are noisy, so the timed calls are split into rounds, and in each round every backend
being measured gets its share in turn (interleaved): a burst of load from elsewhere then lands on
all of them, not on one. A latency is the median of the rounds' medians, its spread the
interquartile range of those medians, and everything needed to compare two measurements is
recorded (batch, sequence length, threads, warm-up, repeats, rounds, CPU model and instruction
sets, torch and ONNX Runtime versions, and for a study deploying on a GPU its model, driver and
CUDA version). A call on the CPU is timed by the wall clock; a call on a GPU between two CUDA
events, the GPU idle before the first.
"""

from __future__ import annotations

import importlib.metadata
import math
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from tuner.data import ExampleInputs
from tuner.devices import gpu_index
from tuner.latency.machine import cpu_model, isa_flags, kernel_caps
from tuner.latency.steadiness import near_floor, reference_for, steadiest_rounds, steady_rounds
from tuner.registry import Registry

STATISTIC_KEY = "deploy.latency.statistic"
# The statistic of code given none, and of studies made before it was a setting.
DEFAULT_STATISTIC = "p50"


@dataclass(frozen=True)
class LatencyProtocol:
    """How a latency is measured.

    Attributes:
        repeats: timed calls per backend the first time an architecture is measured, split
            evenly across `rounds`.
        max_rounds: rounds a measurement may grow to: each later trained model of the same
            architecture adds one round (on its deployed artifact) until there are this many.
        statistic: how a measurement's timed calls are summarised into the latency the study
            ranks by (`LATENCY_STATISTICS`), its objective `objective_name(statistic)`.
        front_sessions: measurement sessions of steady rounds (or not judged) each latency on
            the study's front rests on at the end of a run: front keys with fewer are timed
            again then, at most this many times per run (`tuner.study.confirmation`), so no front
            latency is one stretch of a shared machine's load. 1: none is.
        steady_within: a round counts as steady when the machine reference read, before and
            after it, within this fraction of the process's fastest readings
            (`tuner.latency.steadiness`); None: every round counts, none is timed again.
        steady_attempts: rounds a measurement may time per round it keeps, to find steady
            ones; where too few are, it keeps the steadiest. 1: no round is judged.
        steady_wait_s: seconds the front's confirmation waits, at most, for the machine
            reference to read steady before it times a key again that found too few steady
            rounds (`wait_for_steady`).
    """

    batch_size: int
    seq_len: int
    num_threads: int
    warmup: int
    repeats: int
    rounds: int = 1
    max_rounds: int = 1
    statistic: str = DEFAULT_STATISTIC
    front_sessions: int = 1
    steady_within: float | None = None
    steady_attempts: int = 1
    steady_wait_s: float = 0.0

    @classmethod
    def from_config(cls, latency_cfg: DictConfig) -> LatencyProtocol:
        fields = [name for name in cls.__dataclass_fields__ if name in latency_cfg]
        return cls(**{name: _FIELD_TYPES.get(name, int)(latency_cfg[name]) for name in fields})

    @property
    def calls_per_round(self) -> int:
        return max(1, self.repeats // max(1, self.rounds))

    def record(self, prefix: str = "") -> dict[str, Any]:
        """The protocol and the machine it ran on, as recorded with every measurement."""
        values = {
            **asdict(self),
            "cpu": cpu_model(),
            "cpu_flags": isa_flags(),
            "torch_version": torch.__version__,
            "onnxruntime_version": _version("onnxruntime"),
        }
        # The OpenVINO backends' runtime and quantiser, where installed (left out where not, as
        # records made before they were read).
        for package in OPENVINO_PACKAGES:
            if _version(package) != "absent":
                values[f"{package}_version"] = _version(package)
        caps = kernel_caps()
        if caps:  # left out where none is set: records (and keys) made without stay as they were
            values["kernel_caps"] = caps
        return {f"{prefix}{key}": value for key, value in values.items()}


# The packages of the OpenVINO backends, whose versions a protocol record carries.
OPENVINO_PACKAGES = ("openvino", "nncf")


# How `LatencyProtocol.from_config` reads the fields that are no int.
_FIELD_TYPES: dict[str, Callable[[Any], Any]] = {
    "statistic": str,
    "steady_within": lambda value: None if value is None else float(value),
    "steady_wait_s": float,
}


@dataclass(frozen=True)
class LatencyResult:
    """A latency from timed rounds (each a list of per-call milliseconds).

    Attributes:
        p50_ms: the median of the rounds' medians (with one round: of its calls).
        p95_ms: the 95th percentile of every timed call.
        spread_pct: the interquartile range of the rounds' medians, in percent of `p50_ms`
            (0 with fewer than two rounds).
        fastest_round_ms: the smallest of the rounds' medians.
    """

    p50_ms: float
    p95_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    rounds: int = 1
    spread_pct: float = 0.0
    fastest_round_ms: float = math.nan
    samples_ms: list[float] = field(default_factory=list, repr=False)

    @classmethod
    def of_rounds(cls, rounds: Sequence[Sequence[float]]) -> LatencyResult:
        rounds = [list(r) for r in rounds if len(r)]
        if not rounds:
            raise ValueError("a latency needs at least one timed call")
        samples = np.array([value for r in rounds for value in r])
        medians = np.array([np.median(r) for r in rounds])
        p50 = float(np.median(medians))
        spread = 0.0
        if len(rounds) > 1:
            q25, q75 = np.percentile(medians, [25, 75])
            spread = float(100.0 * (q75 - q25) / p50)
        return cls(
            p50_ms=p50,
            p95_ms=float(np.percentile(samples, 95)),
            mean_ms=float(samples.mean()),
            min_ms=float(samples.min()),
            max_ms=float(samples.max()),
            rounds=len(rounds),
            spread_pct=spread,
            fastest_round_ms=float(medians.min()),
            samples_ms=[float(value) for value in samples],
        )

    def ranked_ms(self, statistic: str) -> float:
        """The latency a study with this `statistic` ranks by."""
        return LATENCY_STATISTICS.get(statistic)(self)

    def metrics(self) -> dict[str, float]:
        """What a point logs of its latency: under every statistic a study may rank by (its
        objective's name among them), p95, and how many rounds it rests on and their spread."""
        return {
            **{objective_name(name): self.ranked_ms(name) for name in LATENCY_STATISTICS},
            "latency_ms_p95": self.p95_ms,
            "latency_rounds": float(self.rounds),
            "latency_spread_pct": self.spread_pct,
        }


# How a measurement is summarised into the one latency a study ranks its points by. p50 is the
# typical call; min, the fastest call, is what a slow spell of a shared machine moves least
# (interference only ever adds time), measured in docs/benchmarks.md "Latency stability".
LATENCY_STATISTICS: Registry[Callable[[LatencyResult], float]] = Registry(STATISTIC_KEY)
LATENCY_STATISTICS.register("p50")(lambda result: result.p50_ms)
LATENCY_STATISTICS.register("min")(lambda result: result.min_ms)


def objective_name(statistic: str) -> str:
    """The latency objective's name (Optuna's metric name, the front's column) under a
    statistic: `latency_ms_p50`, `latency_ms_min`."""
    return f"latency_ms_{statistic}"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@contextmanager
def pinned_threads(num_threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True)
class Timed:
    """What `time_rounds` kept: name -> rounds of milliseconds, and whether those rounds were
    steady (True), the steadiest of too few steady ones (False), or not judged (None)."""

    rounds: dict[str, list[list[float]]]
    steady: bool | None = None


def time_rounds(
    callables: Mapping[str, Callable[..., torch.Tensor]],
    inputs: ExampleInputs,
    protocol: LatencyProtocol,
    rounds: int | None = None,
    on_set_aside: Callable[[int, int], None] | None = None,
) -> Timed:
    """Time every callable in interleaved rounds: `warmup` untimed calls each, then per round
    `calls_per_round` timed calls each, in turn, each after one untimed call (its caches were
    the others' meanwhile) where others ran since its last: before every round but the first,
    or every round where the rounds are judged.

    Rounds are judged with `protocol.steady_within` and `steady_attempts` > 1 (and no
    callable on a GPU): the machine reference is read before the first round and after each,
    and rounds are timed until `rounds` of them are steady (`tuner.latency.steadiness`), at most
    `steady_attempts` times as many; those are kept (or, short of them, the steadiest), and
    `on_set_aside(set aside, timed)` hears of the rounds that were not."""
    wanted = protocol.rounds if rounds is None else rounds
    clocks = {name: _clock_of(logits_of) for name, logits_of in callables.items()}
    within = _judged_within(protocol, clocks.values())
    reference = reference_for(protocol.num_threads) if within is not None else None
    readings: list[float] = []
    timed: list[dict[str, list[float]]] = []

    def more_wanted() -> bool:
        if len(timed) < wanted:
            return True
        if reference is None or within is None or len(timed) >= wanted * protocol.steady_attempts:
            return False
        return len(steady_rounds(readings, reference.floor_ms, within)) < wanted

    with pinned_threads(protocol.num_threads), torch.inference_mode():
        for logits_of in callables.values():
            for _ in range(protocol.warmup):
                logits_of(*inputs.tensors)
        if reference is not None:
            reference.reading_ms()  # its first calls build and warm it
            readings.append(reference.reading_ms())
        while more_wanted():
            one_round = {}
            for name, logits_of in callables.items():
                if reference is not None or (timed and len(callables) > 1):
                    logits_of(*inputs.tensors)
                clock = clocks[name]
                calls = protocol.calls_per_round
                one_round[name] = [clock(logits_of, inputs) for _ in range(calls)]
            timed.append(one_round)
            if reference is not None:
                readings.append(reference.reading_ms())
    if reference is None or within is None:
        return Timed({name: [r[name] for r in timed] for name in callables}, None)
    kept, steady = _kept_rounds(len(timed), wanted, readings, reference.floor_ms, within)
    if len(timed) > wanted and on_set_aside is not None:
        on_set_aside(len(timed) - wanted, len(timed))
    return Timed({name: [timed[i][name] for i in kept] for name in callables}, steady)


def _kept_rounds(
    count: int, wanted: int, readings: list[float], floor_ms: float, within: float
) -> tuple[list[int], bool]:
    """Which of `count` judged rounds count, and whether they are all steady. Rounds timed
    beyond those wanted were timed because too few were steady: the steady ones are kept, or,
    short of them, the steadiest."""
    if count == wanted:
        return list(range(count)), True
    kept = steady_rounds(readings, floor_ms, within)[:wanted]
    if len(kept) == wanted:
        return kept, True
    return steadiest_rounds(readings, wanted), False


def _judged_within(protocol: LatencyProtocol, clocks: Iterable[Clock]) -> float | None:
    """How near the floor a round's readings must be (`protocol.steady_within`) where rounds
    timed by `clocks` are judged; None where they are not. A GPU's time is not judged: the
    reference reads the CPU, whose spells reach a GPU's calls only through their launches; a
    study deploys on one kind of device."""
    if protocol.steady_attempts < 2 or any(clock is _gpu_call_ms for clock in clocks):
        return None
    return protocol.steady_within


def wait_for_steady(
    callables: Mapping[str, Callable[..., torch.Tensor]],
    protocol: LatencyProtocol,
    poll_s: float = 2.0,
) -> float | None:
    """Read the machine reference every `poll_s` seconds until it reads within
    `protocol.steady_within` of its floor, for at most `protocol.steady_wait_s`: the seconds
    waited, or None where no reading was. Nothing is waited for where rounds of `callables` are
    not judged."""
    within = _judged_within(protocol, [_clock_of(logits_of) for logits_of in callables.values()])
    if within is None:
        return 0.0
    reference = reference_for(protocol.num_threads)
    started = time.monotonic()
    with pinned_threads(protocol.num_threads), torch.inference_mode():
        while not near_floor(reference.reading_ms(), reference.floor_ms, within):
            if time.monotonic() - started + poll_s > protocol.steady_wait_s:
                return None
            time.sleep(poll_s)
    return time.monotonic() - started


Clock = Callable[[Callable[..., torch.Tensor], ExampleInputs], float]


def _clock_of(logits_of: Callable[..., torch.Tensor]) -> Clock:
    """How a callable's calls are timed: by the wall clock, or between CUDA events for one
    that runs on a GPU (it has a CUDA `device`)."""
    device = getattr(logits_of, "device", None)
    on_gpu = isinstance(device, torch.device) and device.type == "cuda"
    return _gpu_call_ms if on_gpu else _wall_call_ms


def _wall_call_ms(logits_of: Callable[..., torch.Tensor], inputs: ExampleInputs) -> float:
    started = time.perf_counter()
    logits_of(*inputs.tensors)
    return (time.perf_counter() - started) * 1000


def _gpu_call_ms(logits_of: Callable[..., torch.Tensor], inputs: ExampleInputs) -> float:
    """Between two CUDA events, the GPU idle before the first."""
    device = logits_of.device  # type: ignore[attr-defined]
    torch.cuda.synchronize(device)
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        logits_of(*inputs.tensors)
        end.record()
    end.synchronize()
    return start.elapsed_time(end)


def gpu_record(device_spec: str, prefix: str = "") -> dict[str, str]:
    """The GPU a study deploys on (model, driver, CUDA version), recorded with its latencies;
    nothing for a study deploying on the CPU, whose record stays what it always was."""
    device = torch.device(device_spec)
    if device.type != "cuda":
        return {}
    index = gpu_index(device)
    values = {
        "gpu": torch.cuda.get_device_name(index),
        "gpu_driver": _nvidia_driver(index),
        "cuda_version": str(torch.version.cuda),
    }
    return {f"{prefix}{key}": value for key, value in values.items()}


def _nvidia_driver(index: int) -> str:
    try:
        found = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", str(index)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return found.stdout.strip() or "unknown"


def measure_latency(
    logits_of: Callable[..., torch.Tensor],
    inputs: ExampleInputs,
    protocol: LatencyProtocol,
) -> LatencyResult:
    """One callable under the protocol."""
    return LatencyResult.of_rounds(time_rounds({"": logits_of}, inputs, protocol).rounds[""])
