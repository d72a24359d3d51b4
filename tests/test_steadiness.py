"""Steady rounds: the machine reference read between timed rounds keeps slow spells out."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
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


def test_on_a_steady_machine_the_planned_rounds_are_all_that_are_timed():
    # Within 1000x of the fastest reading: every round is steady.
    protocol = LatencyProtocol(
        1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=1000.0, steady_attempts=3
    )
    calls, kept, set_aside, steady = _timed(protocol)
    # Warm-up once each; then per round each in turn, one untimed call (the reference ran
    # before it) and 4 // 2 timed ones.
    assert calls == "ab" + "aaabbb" * 2
    assert [len(r) for r in kept["a"]] == [2, 2] and [len(r) for r in kept["b"]] == [2, 2]
    assert set_aside == [] and steady is True


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


def test_waiting_for_steady_reads_the_reference_until_a_spell_passes(monkeypatch):
    # Floor 5.0 (the first two readings); within 10% is <= 5.5: the spell reads 9 and 8.
    taken = _scripted(monkeypatch, 1, [5.0, 5.0, 9.0, 8.0, 5.2, 9.0])
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
    waited = wait_for_steady(on_cpu, protocol, poll_s=0.0)
    assert waited is not None and 0.0 <= waited < 60.0
    assert taken == [5.0, 5.0, 9.0, 8.0, 5.2]
    # A spell that outlasts the timeout: one reading, then None.
    assert wait_for_steady(on_cpu, replace(protocol, steady_wait_s=1.0), poll_s=2.0) is None
    assert taken[-1] == 9.0 and len(taken) == 6


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


@pytest.mark.slow
def test_the_noisy_neighbour_keeps_a_core_busy_in_its_spells_only():
    script = str(REPO / "scripts" / "noisy_neighbour.py")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, script, "--seconds", "3", "--on", "1", "--off", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    # Spells of 1 s, 0.5 s apart, each start and end printed with its time (a loaded machine
    # may add a fraction of a second to starting and stopping a process): two, unless the
    # first one's end came so late that no pause of 0.5 s was left before the 3 s end.
    lines = [line.rsplit(" at ", 1) for line in done.stdout.splitlines()]
    times = [float(when.removesuffix(" s")) for _, when in lines]
    spells = list(zip(times[::2], times[1::2], strict=True))
    assert [what for what, _ in lines] == ["spell on", "spell off"] * len(spells)
    assert spells[0][0] < 0.5
    # Stopping a busy process on a loaded machine has taken a second more; a spell is cut
    # where the 3 s end.
    for on, off in spells:
        assert min(1.0, 3.0 - on) - 0.15 <= off - on < 4.0
    if len(spells) == 2:
        assert 0.45 <= spells[1][0] - spells[0][1] < 3.5
    else:
        assert len(spells) == 1 and spells[0][1] + 0.5 >= 3.0 - 0.15, spells
    busy = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # A process streaming memory for most of the two spells (less where the machine is busy).
    assert 0.8 < busy < took
    refused = subprocess.run(
        [sys.executable, script, "--seconds", "3", "--on", "0"], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "--on 0.0: must be > 0" in refused.stderr
    # Killed in a spell (as the docs' recipe does), it leaves no busy process behind.
    killed = subprocess.Popen(
        [sys.executable, script, "--seconds", "60", "--on", "30"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert killed.stdout is not None and killed.stdout.readline().startswith("spell on")
        assert len(_running(script)) == 2  # the script and its busy process
        killed.terminate()
        killed.wait(timeout=30)
        time.sleep(1.0)
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
