"""A measuring worker (`python -m tuner.measure`), run on the machine that will serve: every
architecture x backend of a study that this machine has no latency for is rebuilt untrained
(weights do not change speed), converted and timed under the study's protocol into the study's
latency table, under this machine's name; the latencies on this machine's front are confirmed
with `deploy.latency.front_sessions` sessions, as a training worker confirms its own.

The keys it times are the study's points' keys (`LATENCY_KEY_ATTR`) and those of the running
trials (`LATENCY_KEYS_ATTR`, written before training), each under this machine's protocol record
(`key_on`). One configuration's backends are timed together, in interleaved rounds, and each
session is written whole once timed (`record_session`): a worker killed mid-measurement leaves
nothing of it, and the next one measures it again. Two workers for one machine take the
configurations in their own random order, so they mostly divide the work; where both time one
key, its table holds both sessions.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig

from tuner import console
from tuner.config import compose_config, with_params
from tuner.data import Splits, load_splits
from tuner.front import Constraints, points_of
from tuner.interrupts import raise_if_interrupted
from tuner.keys import BACKEND_KEY, LATENCY_KEY_ATTR, LATENCY_KEYS_ATTR, TRAINED_IN_ATTR
from tuner.latency import LatencyProtocol, time_rounds
from tuner.latency import messages as latency_messages
from tuner.store import (
    LatencyTable,
    Machine,
    budget,
    current_split,
    digest_of,
    key_on,
    record_given_up,
    record_machine,
    record_session,
    storage_of,
    stored_settings,
    study_id_of,
)
from tuner.study import messages
from tuner.study.backends import deployment_backends, runnable_backends
from tuner.study.confirmation import Rebuilder, Target
from tuner.study.preparation import (
    first_calibration_inputs,
    modality_for,
    prepare,
    protocol_record_of,
)
from tuner.study.stored_study import load_study, study_settings
from tuner.tracking import override_keys
from tuner.trial import ModelFactory

TrialState = optuna.trial.TrialState


@dataclass
class Measurer:
    """This machine's measuring of one study: what to rebuild with (this machine's protocol
    record is the rebuilder's), the backends this machine runs (`left_out`: why each other
    listed one does not), and what this run has done."""

    storage: optuna.storages.BaseStorage
    study_id: int
    rebuilder: Rebuilder
    protocol: LatencyProtocol
    constraints: Constraints
    left_out: dict[str, str]
    # Digest -> why this machine cannot time it (said once; not tried again by this run).
    given_up: dict[str, str] = field(default_factory=dict)
    # Digest -> the key it stands for on this machine, for every key this run has met.
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    timed_here: Counter[str] = field(default_factory=Counter)
    order: random.Random = field(default_factory=random.Random)
    # Digest -> the artifact's call and key, for the keys on this machine's front as last
    # drawn: the front's later sessions time them without building and converting again.
    kept: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = field(default_factory=dict)
    # The study's points as `due` last read them, and each one's keys on this machine.
    points: list[optuna.trial.FrozenTrial] = field(default_factory=list)
    digests_of: dict[int, set[str]] = field(default_factory=dict)

    def due(self) -> list[list[Target]]:
        """Per configuration, its keys this machine should time now: those it has no latency
        for, and those of its front short of `front_sessions` sessions that count (each timed at
        most that often by this run). Configurations in this worker's own random order."""
        attrs = self.storage.get_study_user_attrs(self.study_id)
        table = LatencyTable.of_attrs(attrs)
        trials = self.storage.get_all_trials(self.study_id, deepcopy=False)
        record = self.rebuilder.protocol_record
        complete = current_split(trials, attrs).trials
        self.points = complete
        on_front = self._front(table)
        groups: dict[int, dict[str, Target]] = {}
        planned: set[str] = set()
        for trial in [*complete, *(t for t in trials if t.state == TrialState.RUNNING)]:
            for backend, digest in keys_of(trial).items():
                stored = table.keys.get(digest)
                if stored is None:
                    continue
                key = key_on(stored, record)
                here = digest_of(key)
                if here in self.given_up:
                    continue
                self.keys[here] = key
                self.digests_of.setdefault(trial.number, set()).add(here)
                # Configurations of one architecture share its keys: each is timed once.
                if here in planned or self._done_with(here, table, trial.number in on_front):
                    continue
                planned.add(here)
                configuration = int(trial.user_attrs.get(TRAINED_IN_ATTR, trial.number))
                label = f"#{trial.number} {backend}"
                target = Target(label, dict(trial.params), backend, here)
                groups.setdefault(configuration, {})[here] = target
        due = [list(group.values()) for group in groups.values()]
        self.order.shuffle(due)
        return due

    def _front(self, table: LatencyTable) -> set[int]:
        """The trial numbers of this machine's front, as `table` stands."""
        record = self.rebuilder.protocol_record
        points = points_of(self.points, self.constraints, table, record)
        return {p.trial_number for p in points if p.pareto}

    def _done_with(self, digest: str, table: LatencyTable, on_front: bool) -> bool:
        """Whether a key needs no timing now: it has a latency here and, on this machine's
        front, `front_sessions` sessions that count or as many timed by this run."""
        sessions = self.protocol.front_sessions
        if table.round_count(digest) == 0:
            return False
        if not on_front or sessions < 2:
            return True
        return (
            table.counted_session_count(digest) >= sessions or self.timed_here[digest] >= sessions
        )

    def measure(self, targets: Sequence[Target], workdir: Path) -> None:
        """One configuration's keys rebuilt (unless kept from an earlier session), timed in
        interleaved rounds and each session recorded; a key that cannot be rebuilt or timed
        here is given up with the reason."""
        for target in targets:
            if target.backend in self.left_out:
                self._give_up(
                    target, f"this machine cannot run it: {self.left_out[target.backend]}"
                )
        targets = [t for t in targets if t.digest not in self.given_up]
        if not targets:
            return
        started = time.perf_counter()
        artifacts = self._artifacts(targets, workdir)
        converted = time.perf_counter()
        if not artifacts:
            return
        loaded = {label: call for label, (call, _) in artifacts.items()}
        try:
            timed = time_rounds(
                loaded,
                self.rebuilder.example,
                self.protocol,
                on_set_aside=latency_messages.rounds_set_aside,
            )
            console.console.print(
                f"  [dim]{len(loaded)} backend(s) of {targets[0].label.split()[0]}'s "
                f"architecture ready in {converted - started:.1f} s, timed in "
                f"{time.perf_counter() - converted:.1f} s[/]"
            )
        except Exception as exc:
            for target in targets:
                if target.label in loaded:
                    self._give_up(target, f"timing failed: {type(exc).__name__}: {exc}")
            return
        # Read once: each recorded session is added to it here (no read per key).
        table = LatencyTable.of_study(self.storage, self.study_id)
        for target in targets:
            if target.label not in timed.rounds or target.digest is None:
                continue
            rounds = timed.rounds[target.label]
            record_session(
                self.storage, self.study_id, artifacts[target.label][1], rounds, timed.steady
            )
            self.timed_here[target.digest] += 1
            table = table.adding(target.digest, rounds, timed.steady)
            latency = table.result(target.digest)
            assert latency is not None
            console.console.print(
                f"  {target.label:<32} {table.statistic} {latency.ranked_ms(table.statistic):.2f}"
                f" ms ({latency.rounds} rounds, spread {latency.spread_pct:.1f}%)"
            )
        self._keep(targets, artifacts, table)

    def _artifacts(
        self, targets: Sequence[Target], workdir: Path
    ) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
        """Label -> the call and key of each target's artifact, kept or rebuilt now; a target
        that cannot be rebuilt here is given up with the reason."""
        new = [t for t in targets if t.digest not in self.kept]
        rebuilt = self.rebuilder.rebuild(new, workdir)
        for target in new:
            if target.label in rebuilt.skipped:
                self._give_up(target, rebuilt.skipped[target.label])
        made = {label: (call, rebuilt.keys[label]) for label, call in rebuilt.loaded.items()}
        return made | {t.label: self.kept[t.digest] for t in targets if t.digest in self.kept}

    def _keep(
        self,
        targets: Sequence[Target],
        artifacts: dict[str, tuple[Callable[..., Any], dict[str, Any]]],
        table: LatencyTable,
    ) -> None:
        """Keeps the artifacts of the keys on this machine's front as `table` now draws it,
        and lets the others go (a key that comes back onto it is rebuilt)."""
        front = self._front(table)
        wanted = {d for number in front for d in self.digests_of.get(number, ())}
        for target in targets:
            if target.label in artifacts and target.digest is not None:
                self.kept[target.digest] = artifacts[target.label]
        self.kept = {d: made for d, made in self.kept.items() if d in wanted}

    def _give_up(self, target: Target, reason: str) -> None:
        """Said once, and recorded in the study for trials that wait for this machine."""
        assert target.digest is not None
        if target.digest not in self.given_up:
            console.console.print(f"  [yellow]{target.label} not timed here: {reason}[/]")
            record_given_up(self.storage, self.study_id, self.keys[target.digest], reason)
        self.given_up[target.digest] = reason

    def run(self, follow: bool, study_over: Callable[[], bool], poll_s: float) -> None:
        """Time what is due until nothing is; with `follow`, go on timing new configurations
        until `study_over` says the study has ended and nothing is due."""
        with tempfile.TemporaryDirectory(prefix="tuner-measure-") as workdir:
            passes = 0
            while True:
                raise_if_interrupted()
                due = self.due()
                for group in due:
                    raise_if_interrupted()
                    passes += 1
                    self.measure(group, Path(workdir) / str(passes))
                if due:
                    continue
                if not follow or study_over():
                    return
                time.sleep(poll_s)


def keys_of(trial: optuna.trial.FrozenTrial) -> dict[str, str]:
    """Backend -> the digest of its latency key, for a point (its own backend's) or a running
    trial (every backend's, written before it trains)."""
    if trial.state == TrialState.COMPLETE:
        digest = trial.user_attrs.get(LATENCY_KEY_ATTR)
        backend = trial.user_attrs.get(BACKEND_KEY)
        return {} if digest is None or backend is None else {str(backend): str(digest)}
    if trial.state == TrialState.RUNNING:
        return {b: d for b, d in trial.user_attrs.get(LATENCY_KEYS_ATTR, {}).items() if d}
    return {}


def study_over(study: optuna.Study, n_trials: int) -> bool:
    """Whether the study holds its budget of trained configurations and no trial runs."""
    trials = study.get_trials(deepcopy=False)
    return budget.trained(trials) >= n_trials and not any(
        t.state == TrialState.RUNNING for t in trials
    )


@dataclass(frozen=True)
class MeasuringWorker:
    """A measuring worker ready to run: its measurer, the study, and its composed config."""

    measurer: Measurer
    study: optuna.Study
    cfg: DictConfig
    machine: Machine
    # The validation split the front's accuracy is re-checked on.
    splits: Splits


def measuring_worker(overrides: Sequence[str]) -> MeasuringWorker:
    """The measuring worker for the study the overrides name (as given to `python -m tuner`):
    the config checked, the study loaded (never created) and its settings taken, the data it
    needs (the timed input, the calibration batches) loaded, this machine recorded in the
    study under its name."""
    typed = override_keys(list(overrides))
    prepared = prepare(compose_config(list(overrides)), {}, typed)
    study = load_study(prepared.cfg)
    constraints, data_cfg = study_settings(study, prepared.cfg, typed)
    stored = stored_settings(study) or {}
    # The study's protocol, not this command line's defaults: keys are made with it.
    cfg = with_params(
        prepared.cfg, {k: v for k, v in stored.items() if k.startswith("deploy.latency.")}
    )
    splits = load_splits(data_cfg)
    modality = modality_for(cfg, prepared.space, splits)
    protocol = LatencyProtocol.from_config(cfg.deploy.latency)
    example = modality.example(splits.val.items, protocol)
    _, left_out = runnable_backends(deployment_backends(cfg, prepared.space), prepared.sources)
    samples = int(cfg.deploy.calibration_samples)
    calibration = first_calibration_inputs(modality, splits.train, samples)
    record = protocol_record_of(cfg, protocol, example)
    storage, study_id = storage_of(study), study_id_of(study)
    recorded = record_machine(storage, study_id, record)
    messages.machine(recorded)
    rebuilder = Rebuilder(cfg, ModelFactory(splits.num_labels), example, calibration, record)
    measurer = Measurer(storage, study_id, rebuilder, protocol, constraints, left_out)
    return MeasuringWorker(measurer, study, cfg, recorded[0], splits)
