"""Telling a steady machine from a slow spell, so that timed rounds come from steady stretches.

A shared machine has spells, seconds to minutes long, in which every workload on it runs slower
(the reference below read up to twice its fastest on the 2-core machine of docs/benchmarks.md,
"Steady rounds"), the fastest, most often synchronising artifacts most. A fixed reference
workload, timed between the rounds of a measurement, slows down with them: its fastest call
before and after a round, against the fastest readings this process has taken, says whether
the round was taken in such a spell.
`time_rounds` (tuner.latency) uses it to keep a measurement's rounds to steady ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

# The reference: a stack of transformer-FFN-sized linear layers over one 128-token sequence,
# about 5 ms a call on a 2-core AVX-512 machine: its threads synchronise as a model's operators
# do, and a reading between rounds costs little beside them.
_WIDTH, _HIDDEN, _LAYERS, _TOKENS = 384, 768, 12, 128
# Calls per reading; the reading is their fastest.
_CALLS = 5


@dataclass
class MachineReference:
    """The reference workload, built once per process with fixed weights, and the two fastest
    readings this process has taken: the slower of them is the floor rounds are judged by, so
    that one freak fast reading does not make every later round look slow."""

    _fastest: list[float] = field(default_factory=list)
    _model: nn.Module | None = field(default=None, repr=False)
    _input: torch.Tensor | None = field(default=None, repr=False)

    @property
    def floor_ms(self) -> float:
        """The second-fastest reading so far (the only one, after one; inf before any)."""
        return self._fastest[-1] if self._fastest else float("inf")

    def reading_ms(self) -> float:
        """The fastest of a few calls now, on the caller's thread settings, noted."""
        reading = self._fastest_call_ms()
        self._fastest = sorted([*self._fastest, reading])[:2]
        return reading

    def _fastest_call_ms(self) -> float:
        model, inputs = self._built()
        with torch.inference_mode():
            return fastest_call_ms(lambda: model(inputs), _CALLS)

    def _built(self) -> tuple[nn.Module, torch.Tensor]:
        if self._model is None or self._input is None:
            # Built without moving the random stream of whatever is being timed or trained.
            with torch.random.fork_rng():
                torch.manual_seed(0)
                layers = [
                    nn.Linear(_WIDTH, _HIDDEN) if index % 2 == 0 else nn.Linear(_HIDDEN, _WIDTH)
                    for index in range(_LAYERS)
                ]
                self._model = nn.Sequential(*layers).eval()
                self._input = torch.randn(_TOKENS, _WIDTH)
        return self._model, self._input


def fastest_call_ms(call: Callable[[], object], calls: int) -> float:
    """The fastest of `calls` calls, in milliseconds by the wall clock."""
    fastest = float("inf")
    for _ in range(calls):
        started = time.perf_counter()
        call()
        fastest = min(fastest, (time.perf_counter() - started) * 1000)
    return fastest


# One per thread count, from the start of the process or of its latest study run
# (`forget_readings`): its floor is what every later measurement, on as many threads, is
# judged against.
_REFERENCES: dict[int, MachineReference] = {}


def reference_for(num_threads: int) -> MachineReference:
    """The reference on `num_threads` threads (the caller pins them)."""
    return _REFERENCES.setdefault(num_threads, MachineReference())


def forget_readings() -> None:
    """Start every floor afresh. A study run judges its rounds against readings of its own: a
    process that ran other work before (a notebook's earlier studies, a test session) can read
    slower for good than at its quietest moment, and every round of the run would then look
    like a slow spell."""
    _REFERENCES.clear()


def near_floor(reading_ms: float, floor_ms: float, within: float) -> bool:
    """Whether a reading is within `within` (a fraction) of the floor: no slow spell on."""
    return reading_ms <= floor_ms * (1 + within)


def steady_rounds(readings: Sequence[float], floor_ms: float, within: float) -> list[int]:
    """The rounds (indices) both of whose readings, the one before and the one after it
    (`readings` has one more than there are rounds), are within `within` of `floor_ms`."""
    return [
        i
        for i in range(len(readings) - 1)
        if near_floor(max(readings[i], readings[i + 1]), floor_ms, within)
    ]


def steadiest_rounds(readings: Sequence[float], count: int) -> list[int]:
    """The `count` rounds whose slower reading is the fastest, in time order."""
    ranked = sorted(range(len(readings) - 1), key=lambda i: max(readings[i], readings[i + 1]))
    return sorted(ranked[:count])
