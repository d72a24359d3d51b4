"""Steady rounds: the machine reference read between timed rounds keeps slow spells out."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import REPO
from omegaconf import OmegaConf

from tuner.data.batches import ExampleInputs
from tuner.latency.protocol import LatencyProtocol, time_rounds, wait_for_steady
from tuner.latency.steadiness import _REFERENCES, MachineReference, steadiest_rounds, steady_rounds


def test_a_round_is_steady_when_both_readings_around_it_are_near_the_floor():
    # Readings before round 0, between rounds, after round 3; floor 5.0, within 10%: <= 5.5.
    readings = [5.2, 5.4, 7.0, 5.5, 5.0]
    # Round 0 (5.2, 5.4) and round 3 (5.5, 5.0) are steady; rounds 1 and 2 touch the 7.0.
    assert steady_rounds(readings, 5.0, 0.10) == [0, 3]
    assert steady_rounds(readings, 5.0, 0.50) == [0, 1, 2, 3]
    assert steady_rounds(readings, 4.0, 0.10) == []


def test_short_of_steady_rounds_the_steadiest_are_kept_in_time_order():
    # Each round's slower reading: 9, 9, 6, 6.5, 8.
    readings = [8.0, 9.0, 6.0, 6.0, 6.5, 8.0]
    assert steadiest_rounds(readings, 2) == [2, 3]
    assert steadiest_rounds(readings, 3) == [2, 3, 4]


def _timed(protocol: LatencyProtocol):
    """Two recording callables timed under `protocol`: the order of their calls, the rounds
    kept per callable, what `on_set_aside` heard, and whether the kept rounds were steady."""
    calls: list[str] = []

    def recorder(name):
        def call(*_):
            calls.append(name)

        return call

    set_aside: list[tuple[int, int]] = []
    timings = time_rounds(
        {"a": recorder("a"), "b": recorder("b")},
        ExampleInputs((), (), {}),
        protocol,
        on_set_aside=lambda *n: set_aside.append(n),
    )
    return "".join(calls), timings.rounds, set_aside, timings.steady


def test_on_a_steady_machine_the_planned_rounds_are_all_that_are_timed(monkeypatch):
    # The warm-up reading, the one before round 0, one after each round. The floor is the
    # second-fastest reading (5.0): within 10% is <= 5.5, which 5.4 and 5.2 are, so both
    # rounds are steady. A third round would read the 9.0, which no round may touch.
    taken = _scripted(monkeypatch, 1, [5.0, 5.0, 5.4, 5.2, 9.0])
    # Each timed call reads as the number of readings taken before it: round i's as i + 2.
    _clock_reading(monkeypatch, taken)
    protocol = LatencyProtocol(
        1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=0.1, steady_attempts=3
    )
    calls, kept, set_aside, steady = _timed(protocol)
    # Warm-up once each; then per round each in turn, one untimed call (the reference ran
    # before it) and 4 // 2 timed ones.
    assert calls == "ab" + "aaabbb" * 2
    assert kept == {"a": [[2.0, 2.0], [3.0, 3.0]], "b": [[2.0, 2.0], [3.0, 3.0]]}
    assert set_aside == [] and steady is True
    assert taken == [5.0, 5.0, 5.4, 5.2]


def _scripted(monkeypatch, num_threads: int, readings: list[float]) -> list[float]:
    """A fresh reference on `num_threads` threads whose readings are `readings`, in turn; the
    returned list holds those taken so far."""
    taken: list[float] = []
    reference = MachineReference()
    script = iter(readings)

    def next_reading() -> float:
        taken.append(next(script))
        return taken[-1]

    monkeypatch.setattr(reference, "_fastest_call_ms", next_reading)
    monkeypatch.setitem(_REFERENCES, num_threads, reference)
    return taken


def _clock_reading(monkeypatch, taken: list[float]) -> None:
    """Timed calls still make their call, and read as how many readings were taken before."""

    def clock(logits_of, inputs) -> float:
        logits_of(*inputs.tensors)
        return float(len(taken))

    monkeypatch.setattr("tuner.latency.protocol._wall_call_ms", clock)


def test_in_a_slow_spell_more_rounds_are_timed_and_the_steady_ones_kept(monkeypatch):
    # The warm-up reading, the one before round 0, then one after each round. The floor is the
    # second-fastest reading (5.0): within 10% is <= 5.5. Round 0 (5.0, 9.0) and round 1
    # (9.0, 5.1) touch the spell; rounds 2 (5.1, 5.2) and 3 (5.2, 5.3) are steady.
    taken = _scripted(monkeypatch, 1, [5.0, 5.0, 9.0, 5.1, 5.2, 5.3, 5.0, 5.0])
    # Each timed call reads as the number of readings taken before it: round i's as i + 2.
    _clock_reading(monkeypatch, taken)
    protocol = LatencyProtocol(
        1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=0.1, steady_attempts=3
    )
    calls, kept, set_aside, steady = _timed(protocol)
    assert calls == "ab" + "aaabbb" * 4
    assert kept == {"a": [[4.0, 4.0], [5.0, 5.0]], "b": [[4.0, 4.0], [5.0, 5.0]]}
    assert set_aside == [(2, 4)] and steady is True
    assert len(taken) == 6


def test_short_of_steady_rounds_a_measurement_stops_at_its_attempts(monkeypatch):
    # Floor 4.0 (the two first readings); every later reading is over 4.4: no round is steady.
    # Readings before round 0 and after each: 4, 9, 8, 6, 7, 5, 9; the slower one around each
    # round: 9, 9, 8, 7, 7, 9; the steadiest two are rounds 3 and 4 (timed calls 5.0, 6.0).
    taken = _scripted(monkeypatch, 1, [4.0, 4.0, 9.0, 8.0, 6.0, 7.0, 5.0, 9.0, 9.0])
    _clock_reading(monkeypatch, taken)
    protocol = LatencyProtocol(
        1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=0.1, steady_attempts=3
    )
    calls, kept, set_aside, steady = _timed(protocol)
    # steady_attempts (3) times the planned 2 rounds are timed, the steadiest 2 kept: they are
    # no steady rounds.
    assert calls == "ab" + "aaabbb" * 6
    assert kept["a"] == [[5.0, 5.0], [6.0, 6.0]]
    assert set_aside == [(4, 6)] and steady is False


def test_one_attempt_per_round_judges_nothing(monkeypatch):
    taken = _scripted(monkeypatch, 1, [4.0, 4.0, 9.0, 9.0])
    protocol = LatencyProtocol(
        1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=0.1, steady_attempts=1
    )
    calls, kept, set_aside, steady = _timed(protocol)
    assert calls == "ab" + "aabb" + "aaabbb"
    assert set_aside == [] and taken == [] and steady is None


def test_rounds_timed_on_a_gpu_are_not_judged(monkeypatch):
    taken = _scripted(monkeypatch, 1, [4.0, 4.0, 9.0, 9.0])
    # The GPU clock (CUDA events) stood in for: a callable with a CUDA device is timed by it.
    monkeypatch.setattr("tuner.latency.protocol._gpu_call_ms", lambda *_: 1.0)

    def on_gpu(*_):
        return None

    on_gpu.device = torch.device("cuda")  # type: ignore[attr-defined]
    protocol = LatencyProtocol(
        1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=0.1, steady_attempts=3
    )
    timings = time_rounds({"gpu": on_gpu}, ExampleInputs((), (), {}), protocol)
    assert timings.rounds == {"gpu": [[1.0, 1.0], [1.0, 1.0]]} and taken == []
    assert timings.steady is None


def test_the_floor_is_the_second_fastest_reading_so_one_freak_reading_does_not_set_it(
    monkeypatch,
):
    reference = MachineReference()
    script = iter([6.0, 3.0, 5.5, 5.0])
    monkeypatch.setattr(reference, "_fastest_call_ms", lambda: next(script))
    assert reference.floor_ms == float("inf")
    reference.reading_ms()
    assert reference.floor_ms == 6.0
    reference.reading_ms()  # the freak 3.0
    assert reference.floor_ms == 6.0
    reference.reading_ms()
    assert reference.floor_ms == 5.5
    reference.reading_ms()
    assert reference.floor_ms == 5.0


def test_the_reference_is_built_without_moving_the_random_stream():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    MachineReference().reading_ms()
    assert torch.equal(torch.rand(3), expected)


def test_without_steady_within_every_round_counts():
    protocol = LatencyProtocol(1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=None)
    calls, kept, set_aside, steady = _timed(protocol)
    assert calls == "ab" + "aabb" + "aaabbb"
    assert [len(r) for r in kept["a"]] == [2, 2] and set_aside == [] and steady is None


@pytest.mark.parametrize("within", [0.1, None])
def test_the_protocol_reads_steadiness_from_the_config(within):
    cfg = OmegaConf.create(
        {
            "batch_size": 1,
            "seq_len": 8,
            "num_threads": 1,
            "warmup": 1,
            "repeats": 2,
            "steady_within": within,
            "steady_attempts": 3,
            "statistic": "min",
        }
    )
    protocol = LatencyProtocol.from_config(cfg)
    assert protocol.steady_within == within and protocol.steady_attempts == 3
    assert protocol.statistic == "min"


class _Clock:
    """`time` for code under test: `monotonic` reads seconds that pass only in `sleep`."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_waiting_for_steady_reads_the_reference_until_a_spell_passes(monkeypatch):
    # Floor 5.0 (the first two readings); within 10% is <= 5.5: the spell reads 9 and 8.
    taken = _scripted(monkeypatch, 1, [5.0, 5.0, 9.0, 8.0, 5.2, 9.0, 9.0, 9.0, 9.0, 5.0])
    clock = _Clock()
    monkeypatch.setattr(sys.modules["tuner.latency.protocol"], "time", clock)
    reference = _REFERENCES[1]
    reference.reading_ms(), reference.reading_ms()
    protocol = LatencyProtocol(
        1,
        16,
        1,
        warmup=1,
        repeats=4,
        rounds=2,
        steady_within=0.1,
        steady_attempts=3,
        steady_wait_s=60.0,
    )
    on_cpu = {"a": lambda *_: None}
    # Read at 0 s (9.0) and 2 s (8.0), near the floor at 4 s (5.2): 4 s waited.
    assert wait_for_steady(on_cpu, protocol, poll_s=2.0) == 4.0
    assert taken == [5.0, 5.0, 9.0, 8.0, 5.2] and clock.sleeps == [2.0, 2.0]
    # A spell that outlasts 5 s: read at 0, 2 and 4 s; one more poll would end at 6 s, past
    # the 5 s, so it gives up without taking it.
    assert wait_for_steady(on_cpu, replace(protocol, steady_wait_s=5.0), poll_s=2.0) is None
    assert taken[5:] == [9.0, 9.0, 9.0] and clock.sleeps == [2.0] * 4
    # A poll longer than the whole wait: one reading, no sleep, then None (the steady 5.0
    # that would have come next is never read).
    assert wait_for_steady(on_cpu, replace(protocol, steady_wait_s=1.0), poll_s=2.0) is None
    assert len(taken) == 9 and clock.sleeps == [2.0] * 4


def test_nothing_is_waited_for_where_rounds_are_not_judged(monkeypatch):
    taken = _scripted(monkeypatch, 1, [9.0])
    on_cpu = {"a": lambda *_: None}
    for within, attempts in ((None, 3), (0.1, 1)):
        protocol = LatencyProtocol(
            1,
            16,
            1,
            warmup=1,
            repeats=4,
            steady_within=within,
            steady_attempts=attempts,
            steady_wait_s=60.0,
        )
        assert wait_for_steady(on_cpu, protocol) == 0.0

    def on_gpu(*_):
        return None

    on_gpu.device = torch.device("cuda")  # type: ignore[attr-defined]
    judged = LatencyProtocol(
        1, 16, 1, warmup=1, repeats=4, steady_within=0.1, steady_attempts=3, steady_wait_s=60.0
    )
    assert wait_for_steady({"gpu": on_gpu}, judged) == 0.0
    assert taken == []


NOISY_NEIGHBOUR = REPO / "scripts" / "noisy_neighbour.py"


def _script_module() -> types.ModuleType:
    """scripts/noisy_neighbour.py, imported (its `main` not run)."""
    spec = importlib.util.spec_from_file_location("noisy_neighbour", NOISY_NEIGHBOUR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Neighbour:
    """scripts/noisy_neighbour.py loaded as a module, on a `_Clock`, with stand-ins for its busy
    processes: their starts and ends, and the lines the script prints, go to `events` in order.
    The signal handlers it installs go to `handlers`, not to this process."""

    def __init__(self, monkeypatch) -> None:
        self.clock = _Clock()
        self.events: list[str] = []
        self.handlers: dict[int, Callable] = {}
        self.module = _script_module()
        events, clock, module = self.events, self.clock, self.module

        class Busy:
            def __init__(self, target, daemon):
                assert target is module._stream and daemon
                self.alive = False

            def start(self):
                self.alive = True
                events.append(f"busy start at {clock.now:.1f}")

            def is_alive(self):
                return self.alive

            def terminate(self):
                self.alive = False
                events.append(f"busy end at {clock.now:.1f}")

            def join(self):
                assert not self.alive

        monkeypatch.setattr(module, "time", clock)
        monkeypatch.setattr(module, "multiprocessing", types.SimpleNamespace(Process=Busy))
        installed = types.SimpleNamespace(SIGTERM=signal.SIGTERM, signal=self.handlers.__setitem__)
        monkeypatch.setattr(module, "signal", installed)
        monkeypatch.setattr(module, "print", lambda line, flush: events.append(line), raising=False)


@pytest.mark.parametrize(
    ("seconds", "spells"),
    [
        # 1 s on, 0.5 s off: on at 0, off at 1; on at 1.5, off at 2.5; the last pause ends at 3.
        ("3", [("0.0", "1.0"), ("1.5", "2.5")]),
        # The second spell is cut where the 2.2 s end: 0.7 s long.
        ("2.2", [("0.0", "1.0"), ("1.5", "2.2")]),
        # The first pause is cut at 1.2 s: no second spell.
        ("1.2", [("0.0", "1.0")]),
    ],
)
def test_the_noisy_neighbour_keeps_a_process_busy_in_its_spells_only(monkeypatch, seconds, spells):
    neighbour = _Neighbour(monkeypatch)
    neighbour.module.main(["--seconds", seconds, "--on", "1", "--off", "0.5"])
    expected = []
    for on, off in spells:
        expected += [f"busy start at {on}", f"spell on at {on} s"]
        expected += [f"busy end at {off}", f"spell off at {off} s"]
    assert neighbour.events == expected
    # It sleeps through spells and pauses and returns at the end, not before.
    assert neighbour.clock.now == pytest.approx(float(seconds))
    assert list(neighbour.handlers) == [signal.SIGTERM]


def test_the_noisy_neighbour_killed_in_a_spell_ends_its_busy_process(monkeypatch):
    neighbour = _Neighbour(monkeypatch)
    sleep = neighbour.clock.sleep

    def killed_10_s_in(seconds: float) -> None:
        # `kill` lands 10 s into the 30 s spell, while the script sleeps in it.
        sleep(10.0)
        neighbour.handlers[signal.SIGTERM](signal.SIGTERM, None)

    neighbour.clock.sleep = killed_10_s_in  # type: ignore[method-assign]
    with pytest.raises(SystemExit) as ended:
        neighbour.module.main(["--seconds", "60", "--on", "30"])
    assert ended.value.code == 0
    # Its busy process ended on the way out; no "spell off" (the spell did not run out).
    assert neighbour.events == ["busy start at 0.0", "spell on at 0.0 s", "busy end at 10.0"]


def test_the_noisy_neighbour_refuses_empty_spells(capsys):
    with pytest.raises(SystemExit) as refused:
        _script_module().main(["--seconds", "3", "--on", "0"])
    assert refused.value.code == 2 and "--on 0.0: must be > 0" in capsys.readouterr().err


def _cpu_ticks(pid: int) -> int:
    """The user and system CPU time a process has used, in clock ticks (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15


@pytest.mark.slow
@pytest.mark.timeout(120)  # a script that never prints its next line fails, not hangs
def test_the_noisy_neighbour_s_busy_process_runs_in_its_spell_and_goes_with_it():
    script = str(NOISY_NEIGHBOUR)
    # A spell of 0.5 s, then a pause longer than the test: at "spell off" its busy process has
    # ended (it is ended and joined before the line is printed).
    pausing = subprocess.Popen(
        [sys.executable, script, "--seconds", "60", "--on", "0.5", "--off", "60"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert pausing.stdout is not None and pausing.stdout.readline().startswith("spell on")
        assert pausing.stdout.readline().startswith("spell off")
        assert _running(script) == [pausing.pid]
        pausing.terminate()
        assert pausing.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pausing.pid, signal.SIGKILL)
    # Killed in a spell (as the docs' recipe does), it leaves no busy process behind.
    killed = subprocess.Popen(
        [sys.executable, script, "--seconds", "60", "--on", "30"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert killed.stdout is not None and killed.stdout.readline().startswith("spell on")
        (busy,) = [pid for pid in _running(script) if pid != killed.pid]
        # It keeps a core busy: while it is watched it uses a whole second of CPU time, more
        # than filling its arrays takes, within its 30 s spell (it is gone once that ends).
        first = _cpu_ticks(busy)
        while _cpu_ticks(busy) < first + os.sysconf("SC_CLK_TCK"):
            time.sleep(0.05)
        killed.terminate()
        assert killed.wait(timeout=30) == 0
        # The script ended and joined it before it exited: gone at once.
        assert _running(script) == []
    finally:  # nothing left to load the machine, whatever failed
        with contextlib.suppress(ProcessLookupError):
            os.killpg(killed.pid, signal.SIGKILL)


def _running(script: str) -> list[int]:
    """The processes whose command line names `script`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
            if script.encode() in cmdline:
                found.append(int(entry.name))
    return found
