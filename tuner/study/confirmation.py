"""Timing a study's points again, later: weights do not change speed, so a point's architecture
is rebuilt untrained and converted to its backend, and its latency key checked against the one
the point was measured under.

`confirm_front` gives each latency on the study's front the measurement sessions
`deploy.latency.front_sessions` asks for at the end of a run, so that no front latency is one
stretch of a shared machine's load: a slow spell that lasts through one session is outweighed by
another session at another time (docs/benchmarks.md, "Confirming the front"). The same rebuilding
serves `scripts/retime_front.py`.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch
from omegaconf import DictConfig
from torch import nn

from tuner import console
from tuner.config import with_params
from tuner.data import ExampleInputs
from tuner.deploy import convert_into
from tuner.front import Constraints, points_of
from tuner.keys import BACKEND_KEY, LATENCY_KEY_ATTR
from tuner.latency import LatencyProtocol, LatencyResult, Timed, time_rounds, wait_for_steady
from tuner.latency import messages as latency_messages
from tuner.models import ModelRecipe
from tuner.store import (
    LatencyTable,
    digest_of,
    latency_key,
    measured_alike,
    record_session,
    storage_of,
    stored_key,
    structure_of,
    study_id_of,
)
from tuner.study import messages
from tuner.trial import ModelFactory, untrained_model


@dataclass(frozen=True)
class Target:
    """One point to time again: its label (`#7 onnxruntime_int8`), the trial params that built
    it, its backend, and the digest of its latency key (None: it has none)."""

    label: str
    params: Mapping[str, Any]
    backend: str
    digest: str | None


@dataclass(frozen=True)
class Rebuilt:
    """The targets ready to time (label -> the artifact's call), the latency key each was
    rebuilt under, and why the others could not be (label -> reason)."""

    loaded: dict[str, Callable[..., Any]]
    keys: dict[str, dict[str, Any]]
    skipped: dict[str, str]


# A rebuilt artifact is only timed: int8 ranges calibrated on one batch give the graph many give
# (tests/deploy/test_calibration.py), so its speed, in a fraction of the calibration's time
# (NNCF's 9 s of a MiniLM architecture's openvino_int8 conversion). Backends whose graph
# follows the data they calibrate on have no latency key and are never rebuilt.
TIMING_CALIBRATION_BATCHES = 1


@dataclass(frozen=True)
class Rebuilder:
    """What rebuilding a study's points needs: its composed config, the model factory, the
    timed input and calibration batches, and the protocol record latency keys are made with."""

    cfg: DictConfig
    factory: ModelFactory
    example: ExampleInputs
    calibration: Sequence[tuple[torch.Tensor, ...]]
    protocol_record: Mapping[str, Any]

    def rebuild(self, targets: Sequence[Target], workdir: Path) -> Rebuilt:
        """Each target's untrained architecture converted to its backend. A target whose
        rebuilt key is not the one it was measured under (another machine, other settings) or
        that fails to convert is skipped with the reason: its rounds would belong elsewhere.
        Targets whose params differ only in the backend share one model, and its backends one
        export (as a trial's backends do)."""
        loaded, keys, skipped = {}, {}, {}
        built: dict[str, tuple[nn.Module, Path]] = {}
        # Building and converting must not move the random stream of whatever runs next.
        with torch.random.fork_rng():
            for target in targets:
                try:
                    made = self._model(target, workdir, built)
                    key, logits_of = self._one(target, *made)
                except Exception as exc:
                    skipped[target.label] = f"{type(exc).__name__}: {exc}"
                    continue
                if logits_of is None:
                    skipped[target.label] = (
                        "its latency key here differs from the one it was measured under: "
                        "another machine, library version, deploy setting or architecture"
                    )
                    continue
                loaded[target.label], keys[target.label] = logits_of, key
        return Rebuilt(loaded, keys, skipped)

    def _model(
        self, target: Target, workdir: Path, built: dict[str, tuple[nn.Module, Path]]
    ) -> tuple[DictConfig, nn.Module, Path]:
        """The target's config, its untrained model and the directory its backends convert
        into: built once for every backend of the same other params."""
        cfg = with_params(self.cfg, target.params)
        others = {k: v for k, v in target.params.items() if k != BACKEND_KEY}
        params = json.dumps(others, sort_keys=True, default=str)
        if params not in built:
            seed = int(cfg.train.seed)
            model = untrained_model(cfg, lambda: self.factory.build(cfg.model, seed))
            built[params] = (model.eval(), workdir / str(len(built)))
        return (cfg, *built[params])

    def _one(
        self, target: Target, cfg: DictConfig, model: nn.Module, deployment: Path
    ) -> tuple[dict[str, Any], Callable[..., Any] | None]:
        """The target's latency key as rebuilt here, and its artifact's call (None, not
        converted, where the key is not the one it was measured under)."""
        key = latency_key(
            cfg.model, structure_of(model), target.backend, cfg.deploy, self.protocol_record
        )
        if target.digest is not None and digest_of(key) != target.digest:
            return key, None
        converted = convert_into(
            deployment,
            target.backend,
            model,
            ModelRecipe.of(cfg.model, self.factory.num_labels),
            self.example,
            cfg.deploy,
            self.calibration[:TIMING_CALIBRATION_BATCHES],
        )
        return key, converted.logits_of


def target_of(trial: optuna.trial.FrozenTrial, backend: str) -> Target:
    """A point of `trial` on `backend`, built from the trial's params (the teacher reference
    a teacher's points show beside them is no config key)."""
    return Target(
        f"#{trial.number} {backend}",
        dict(trial.params),
        backend,
        trial.user_attrs.get(LATENCY_KEY_ATTR),
    )


@dataclass(frozen=True)
class Confirmation:
    """A latency key timed again by `confirm_front`: its latency before and after the session
    was added (by the study's statistic), the session alone, and whether its rounds were
    steady (`Timed.steady`)."""

    label: str
    before: LatencyResult
    session: LatencyResult
    after: LatencyResult
    steady: bool | None


def confirm_front(
    study: optuna.Study,
    rebuilder: Rebuilder,
    protocol: LatencyProtocol,
    constraints: Constraints,
) -> list[Confirmation]:
    """Time each front latency key with fewer than `protocol.front_sessions` sessions that
    count (`LatencyTable.counted_session_count`) again, its architectures
    interleaved, and add the sessions to the study's table; the front is drawn again after each
    pass (a latency that moved can let another point onto it) until every front key has its
    sessions, could not be timed here (said, and left as it was), or has been timed
    `front_sessions` times by this run (said where it is still short of sessions that count).
    A key timed again waits first for the machine reference to read steady
    (`wait_for_steady`), at most `protocol.steady_wait_s`."""
    run = _FrontConfirmation(storage_of(study), study_id_of(study), rebuilder, protocol)
    confirmed: list[Confirmation] = []
    with tempfile.TemporaryDirectory(prefix="tuner-confirm-") as workdir:
        while True:
            table = LatencyTable.of_study(run.storage, run.study_id)
            trials = study.get_trials(deepcopy=False)
            due = _due(trials, table, constraints, protocol.front_sessions, run.done_with)
            if not due:
                return confirmed
            messages.confirming_front(len(due), protocol.front_sessions)
            confirmed += run.time_again(due, table, Path(workdir) / str(run.passes))


@dataclass
class _FrontConfirmation:
    """One run's confirmation of its study's front, carried from pass to pass: the keys it is
    done with (timed `front_sessions` times here, or not timeable here), how often it timed
    each key, and each due key's rebuilt artifact (its call and latency key), kept so that a
    key timed again is not converted again."""

    storage: optuna.storages.BaseStorage
    study_id: int
    rebuilder: Rebuilder
    protocol: LatencyProtocol
    done_with: set[str] = field(default_factory=set)
    timed_here: Counter[str] = field(default_factory=Counter)
    rebuilt_here: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = field(default_factory=dict)
    passes: int = 0

    def time_again(
        self, due: Sequence[Target], table: LatencyTable, workdir: Path
    ) -> list[Confirmation]:
        """One pass: `due`'s keys timed in interleaved rounds, each session recorded in the
        study's table (`table` is the table before them); says what moved, which keys could
        not be timed, and which stay short of sessions that count."""
        loaded, skipped = self._artifacts(due, workdir)
        measured = self._timed(due, loaded, skipped)
        this_pass = []
        # Label -> (sessions that count, sessions) of keys left short of them.
        short: dict[str, tuple[int, int]] = {}
        for target in due:
            assert target.digest is not None
            if target.label not in measured.rounds:
                self.done_with.add(target.digest)
                messages.not_confirmed(target.label, skipped[target.label])
                continue
            rounds = measured.rounds[target.label]
            key = self.rebuilt_here[target.digest][1]
            record_session(self.storage, self.study_id, key, rounds, measured.steady)
            before = table.result(target.digest)
            assert before is not None
            added = table.adding(target.digest, rounds, measured.steady)
            after = added.result(target.digest)
            assert after is not None
            session = LatencyResult.of_rounds(rounds)
            this_pass.append(Confirmation(target.label, before, session, after, measured.steady))
            self.timed_here[target.digest] += 1
            # A run times a key at most `front_sessions` times, whatever the machine does.
            if self.timed_here[target.digest] >= self.protocol.front_sessions:
                self.done_with.add(target.digest)
                counted = added.counted_session_count(target.digest)
                if counted < self.protocol.front_sessions:
                    short[target.label] = (counted, added.session_count(target.digest))
        confirmed(this_pass, table.statistic)
        for label, (counted, sessions) in short.items():
            messages.short_of_steady_sessions(label, counted, sessions)
        self.passes += 1
        return this_pass

    def _artifacts(
        self, due: Sequence[Target], workdir: Path
    ) -> tuple[dict[str, Callable[..., Any]], dict[str, str]]:
        """Label -> the call of each due key's artifact (rebuilt here unless an earlier pass
        did), and label -> why a target could not be rebuilt."""
        digests = {target.digest for target in due}
        self.rebuilt_here = {d: made for d, made in self.rebuilt_here.items() if d in digests}
        new = [target for target in due if target.digest not in self.rebuilt_here]
        rebuilt = self.rebuilder.rebuild(new, workdir)
        for target in new:
            if target.label in rebuilt.loaded and target.digest is not None:
                made = (rebuilt.loaded[target.label], rebuilt.keys[target.label])
                self.rebuilt_here[target.digest] = made
        loaded = {
            target.label: self.rebuilt_here[target.digest][0]
            for target in due
            if target.digest in self.rebuilt_here
        }
        return loaded, dict(rebuilt.skipped)

    def _timed(
        self,
        due: Sequence[Target],
        loaded: Mapping[str, Callable[..., Any]],
        skipped: dict[str, str],
    ) -> Timed:
        """`loaded` timed in interleaved rounds, after waiting for a steady stretch where this
        run timed a due key before (it found too few steady rounds); a failed timing leaves
        every target in `skipped` with the reason."""
        if not loaded:
            return Timed({})
        if any(self.timed_here[target.digest or ""] for target in due):
            waited = wait_for_steady(loaded, self.protocol)
            messages.waited_for_steady(waited, self.protocol.steady_wait_s)
        try:
            return time_rounds(
                loaded,
                self.rebuilder.example,
                self.protocol,
                on_set_aside=latency_messages.rounds_set_aside,
            )
        except Exception as exc:  # the front keeps the latencies it has
            skipped.update(dict.fromkeys(loaded, f"timing failed: {type(exc).__name__}: {exc}"))
            return Timed({})


def front_unconfirmed(
    study: optuna.Study,
    constraints: Constraints,
    sessions: int,
    deploy_cfg: DictConfig,
    protocol_record: Mapping[str, Any],
) -> bool:
    """Whether a latency key on the study's front has fewer than `sessions` sessions that
    count and was measured under this run's deploy settings and protocol (the machine
    included): `confirm_front` would time it here."""
    attrs = study.user_attrs
    table = LatencyTable.of_attrs(attrs)
    due = _due(study.get_trials(deepcopy=False), table, constraints, sessions, set())
    return any(
        measured_alike(stored_key(attrs, target.digest or ""), deploy_cfg, protocol_record)
        for target in due
    )


def _due(
    trials: Sequence[optuna.trial.FrozenTrial],
    table: LatencyTable,
    constraints: Constraints,
    sessions: int,
    done_with: set[str],
) -> list[Target]:
    """One target per front latency key with fewer than `sessions` sessions that count (and
    one at least: a key with none has never been timed), leaving out those in `done_with`.
    None where `sessions` is 1: a key's first session is all it asks, whatever its rounds
    were."""
    if sessions < 2:
        return []
    points = points_of(trials, constraints, table)
    by_number = {t.number: t for t in trials}
    due: dict[str, Target] = {}
    for point in points:
        target = target_of(by_number[point.trial_number], point.backend)
        if (
            point.pareto
            and target.digest
            and target.digest not in due
            and target.digest not in done_with
            and table.session_count(target.digest) > 0
            and table.counted_session_count(target.digest) < sessions
        ):
            due[target.digest] = target
    return list(due.values())


def confirmed(confirmations: Sequence[Confirmation], statistic: str) -> None:
    """One line per key timed again: its latency before, this session's, and the latency over
    the sessions that count."""
    for done in confirmations:
        before, session, after = (
            r.ranked_ms(statistic) for r in (done.before, done.session, done.after)
        )
        unsteady = " (too few steady rounds: the steadiest kept)" if done.steady is False else ""
        console.console.print(
            f"  {done.label:<32} {statistic} {before:.2f} ms, this session {session:.2f} ms "
            f"({100 * (session - before) / before:+.1f}%){unsteady} -> {after:.2f} ms "
            f"({done.after.rounds} rounds)"
        )
