"""Steady rounds: the machine reference read between timed rounds keeps slow spells out."""

from __future__ import annotations

import pytest

from tuner.backends import ExampleInputs
from tuner.latency import LatencyProtocol, time_rounds
from tuner.steadiness import reference_for, steadiest_rounds, steady_rounds


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
    kept per callable (each as its number of calls), and what `on_set_aside` heard."""
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
    kept = {name: [len(r) for r in rounds] for name, rounds in timings.items()}
    return "".join(calls), kept, set_aside


def test_on_a_steady_machine_the_planned_rounds_are_all_that_are_timed():
    # Within 1000x of the fastest reading: every round is steady.
    protocol = LatencyProtocol(
        1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=1000.0, steady_attempts=3
    )
    calls, kept, set_aside = _timed(protocol)
    # Warm-up once each; then per round each in turn, one untimed call (the reference ran
    # before it) and 4 // 2 timed ones.
    assert calls == "ab" + "aaabbb" * 2
    assert kept == {"a": [2, 2], "b": [2, 2]}
    assert set_aside == []


def test_in_a_slow_spell_more_rounds_are_timed_and_the_planned_number_kept(monkeypatch):
    protocol = LatencyProtocol(
        1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=0.1, steady_attempts=3
    )
    reference = reference_for(1)
    reference.reading_ms()  # built, with a floor of its own
    # A floor no reading comes near: every round reads as a slow spell.
    monkeypatch.setattr(reference, "floor_ms", 1e-9)
    calls, kept, set_aside = _timed(protocol)
    # steady_attempts (3) times the planned 2 rounds are timed; 2 are kept, 4 set aside.
    assert calls == "ab" + "aaabbb" * 6
    assert kept == {"a": [2, 2], "b": [2, 2]}
    assert set_aside == [(4, 6)]


def test_without_steady_within_every_round_counts():
    protocol = LatencyProtocol(1, 16, 1, warmup=1, repeats=4, rounds=2, steady_within=None)
    calls, kept, set_aside = _timed(protocol)
    assert calls == "ab" + "aabb" + "aaabbb"
    assert kept == {"a": [2, 2], "b": [2, 2]} and set_aside == []


@pytest.mark.parametrize("within", [0.1, None])
def test_the_protocol_reads_steadiness_from_the_config(within):
    from omegaconf import OmegaConf

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
