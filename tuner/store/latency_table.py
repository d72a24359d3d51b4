"""The study's latency table: latency as a property of (architecture, backend, protocol,
machine), measured once and shared by every trial, worker and resume of the study.

The weights of a model do not change how fast it runs, so the first trial that meets a key
measures it (interleaved across backends: on the trained artifacts, or before training on the
untrained model when a latency budget or early stopping needs it then) and later trials with
the same key reuse it; each may add a round (`LatencyProtocol.max_rounds`) but none starts over.
Points of one architecture and backend therefore share one latency. A backend whose graph
follows the trained weights (`Backend.graph_from_weights`) has no key: each of its artifacts is
timed on its own.

The table lives in the study's own storage as Optuna study user attributes, one per measurement
session (`latency:<key digest>:<session>`: its rounds, whether they were steady), each written
once, whole, after its last round: a worker that dies mid-measurement leaves nothing half-done,
and two workers measuring one key at once both add their rounds instead of overwriting each
other. What a digest stands for is written beside them once (`latency-key:<key digest>`), for
people reading the study.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna
from omegaconf import DictConfig, OmegaConf
from torch import nn

from tuner.edits import edit_keys
from tuner.latency import DEFAULT_STATISTIC, STATISTIC_KEY, LatencyResult
from tuner.store.settings import settings_in

_PREFIX = "latency:"
_KEY_PREFIX = "latency-key:"
_GIVEN_UP_PREFIX = "latency-given-up:"
# Model keys that change training but not the graph that is timed.
_TRAINING_ONLY = frozenset({"random_init", "dropout", "drop_rate"})
# Deploy keys that are the protocol (in the key on their own) or choose the backend, the
# device (a backend deploys on one kind, and a GPU's model is in the protocol record), the
# machine (its name is in the protocol record), how far a re-check on another machine may
# disagree (no part of what is timed), and the settings of onnxruntime_mixed, whose latency the
# table never keeps (its graph follows the trained weights).
_NOT_IN_DEPLOY_KEY = frozenset(
    {"agreement_tolerance", "backend", "device", "latency", "machine", "mixed"}
)
# How far a measurement may grow (in rounds, in sessions) is no part of what it measures:
# raising it extends the table; nor is how its calls are summarised (the rounds are kept whole),
# nor which rounds are kept: steady ones measure the same latency as any others, with less of
# the machine's load in them.
# A `deploy` node and protocol record fields that one family of backends alone reads, by the
# prefix of its backends' names: in the keys of that family's backends only, so that every other
# backend's keys stayed as they were when the family came.
_FAMILY_ONLY: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "openvino": (
        frozenset({"openvino"}),
        frozenset({"latency.openvino_version", "latency.nncf_version"}),
    ),
}
_NOT_IN_PROTOCOL_KEY = frozenset(
    {
        "latency.max_rounds",
        "latency.front_sessions",
        "latency.statistic",
        "latency.steady_within",
        "latency.steady_attempts",
        "latency.steady_wait_s",
    }
)


def structure_of(model: nn.Module) -> list[list[Any]]:
    """The model's tensors as [name, shape, dtype], parameters then buffers: the architecture
    as built, whichever config values (a null edit, a fraction, the width it stands for) chose
    it."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return [[name, list(tensor.shape), str(tensor.dtype)] for name, tensor in tensors]


def latency_key(
    model_cfg: DictConfig,
    structure: Sequence[Sequence[Any]],
    backend: str,
    deploy_cfg: DictConfig,
    protocol_record: Mapping[str, Any],
) -> dict[str, Any]:
    """What decides a latency: the built architecture (`structure_of`), the rest of the model
    config (what builds the same tensors into another graph: the model's name, its activation),
    the backend and its settings, the protocol, the input shape and the machine (CPU model,
    instruction sets, library versions, all in `protocol_record`).

    The keys that size the model (structural edits, the family's size keys) are left out: the
    structure holds what they did, so `ffn_width_fraction=0.667` and `ffn_width=1024` are one
    key, as are the unedited model and a student edited to its full size.
    """
    from tuner.models import MODEL_FAMILIES

    model = OmegaConf.to_container(model_cfg, resolve=True)
    assert isinstance(model, dict)
    family = MODEL_FAMILIES.get(str(model["family"]))
    sizing = edit_keys() | set(family.size_keys)
    return {
        "model": {k: v for k, v in model.items() if k not in _TRAINING_ONLY | sizing},
        "structure": hashlib.sha256(json.dumps(list(structure)).encode()).hexdigest(),
        "backend": backend,
        "deploy": _deploy_in_key(deploy_cfg, backend),
        "protocol": _protocol_in_key(protocol_record, backend),
    }


def _other_families(backend: str) -> tuple[frozenset[str], frozenset[str]]:
    """The `deploy` nodes and protocol fields of the backend families `backend` is not of."""
    nodes, fields = frozenset(), frozenset()
    for prefix, (family_nodes, family_fields) in _FAMILY_ONLY.items():
        if not backend.startswith(prefix):
            nodes, fields = nodes | family_nodes, fields | family_fields
    return nodes, fields


def _deploy_in_key(deploy_cfg: DictConfig, backend: str) -> dict[str, Any]:
    deploy = OmegaConf.to_container(deploy_cfg, resolve=True)
    assert isinstance(deploy, dict)
    left_out = _NOT_IN_DEPLOY_KEY | _other_families(backend)[0]
    return {k: v for k, v in deploy.items() if k not in left_out}


def _protocol_in_key(protocol_record: Mapping[str, Any], backend: str) -> dict[str, Any]:
    left_out = _NOT_IN_PROTOCOL_KEY | _other_families(backend)[1]
    return {k: v for k, v in protocol_record.items() if k not in left_out}


def stored_key(user_attrs: Mapping[str, Any], digest: str) -> Mapping[str, Any] | None:
    """The latency key a digest stands for, as the study stores it beside its sessions."""
    return user_attrs.get(f"{_KEY_PREFIX}{digest}")


def measured_alike(
    key: Mapping[str, Any] | None, deploy_cfg: DictConfig, protocol_record: Mapping[str, Any]
) -> bool:
    """Whether a stored key's deploy settings and protocol (the machine included) are these:
    its architecture, rebuilt under them, can have that key again. Compared as stored (JSON),
    so tuples and lists read alike."""
    if key is None:
        return False
    backend = str(key.get("backend"))
    here = json.loads(
        json.dumps(
            {
                "deploy": _deploy_in_key(deploy_cfg, backend),
                "protocol": _protocol_in_key(protocol_record, backend),
            },
            default=str,
        )
    )
    return {"deploy": key.get("deploy"), "protocol": key.get("protocol")} == here


def key_on(key: Mapping[str, Any], protocol_record: Mapping[str, Any]) -> dict[str, Any]:
    """The latency key of the same architecture, backend and deploy settings under another
    protocol record: another machine's (`tuner.store.machines`)."""
    return {**key, "protocol": _protocol_in_key(protocol_record, str(key.get("backend")))}


def digest_of(key: Mapping[str, Any]) -> str:
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Session:
    """One measurement session of a key: its rounds, and whether they were steady (True), the
    steadiest of too few steady ones (False), or not judged (None: steadiness off, or a
    session recorded before the table kept the flag)."""

    rounds: list[list[float]]
    steady: bool | None = None

    @property
    def counts(self) -> bool:
        """Whether it outweighs sessions of too few steady rounds (`LatencyTable.pooled`)."""
        return self.steady is not False


@dataclass(frozen=True)
class LatencyTable:
    """The measurement sessions of every key of a study (digest -> sessions in time order), as
    read at one moment, and the statistic the study ranks latency by
    (`deploy.latency.statistic`, a study setting).

    A key's latency pools the rounds of `pooled` sessions: those that count (steady rounds, or
    not judged) once they hold at least as many rounds as any session of too few steady ones,
    which are then left out, as a slow round is left out of a session; until then, every
    session."""

    sessions: dict[str, list[Session]] = field(default_factory=dict)
    statistic: str = DEFAULT_STATISTIC
    # Digest -> the key it stands for, for every key the study has written.
    keys: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    # Digest -> why the machine it names could not time it (`record_given_up`).
    given_up: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_attrs(cls, user_attrs: Mapping[str, Any]) -> LatencyTable:
        """Every key's sessions, in time order. The statistic is the study's stored one (the
        default for a study that stores no settings)."""
        found: dict[str, list[tuple[str, Session]]] = {}
        for name, session in user_attrs.items():
            if not name.startswith(_PREFIX) or not isinstance(session, dict):
                continue
            digest = name[len(_PREFIX) :].split(":", 1)[0]
            found.setdefault(digest, []).append(
                (str(session.get("at", "")), Session(session["rounds"], session.get("steady")))
            )
        settings = settings_in(user_attrs) or {}
        return cls(
            {
                digest: [s for _, s in sorted(timed, key=lambda t: t[0])]
                for digest, timed in found.items()
            },
            str(settings.get(STATISTIC_KEY, DEFAULT_STATISTIC)),
            {
                name[len(_KEY_PREFIX) :]: key
                for name, key in user_attrs.items()
                if name.startswith(_KEY_PREFIX) and isinstance(key, dict)
            },
            {
                name[len(_GIVEN_UP_PREFIX) :]: str(reason)
                for name, reason in user_attrs.items()
                if name.startswith(_GIVEN_UP_PREFIX)
            },
        )

    @classmethod
    def of_study(cls, storage: optuna.storages.BaseStorage, study_id: int) -> LatencyTable:
        return cls.of_attrs(storage.get_study_user_attrs(study_id))

    @property
    def rounds(self) -> dict[str, list[list[float]]]:
        """Digest -> every round of its sessions, in time order (what the key's measurement has
        grown to, pooled or not)."""
        return {
            digest: [r for session in found for r in session.rounds]
            for digest, found in self.sessions.items()
        }

    def result(self, digest: str | None) -> LatencyResult | None:
        """The key's latency over its pooled sessions, or None while it has not been
        measured."""
        rounds = [r for session in self.pooled(digest or "") for r in session.rounds]
        return LatencyResult.of_rounds(rounds) if rounds else None

    def digest_on(self, digest: str | None, protocol_record: Mapping[str, Any]) -> str | None:
        """The digest of key `digest` under another machine's protocol record (`key_on`); None
        where the study does not hold the key."""
        key = self.keys.get(digest or "")
        return None if key is None else digest_of(key_on(key, protocol_record))

    def pooled(self, digest: str) -> list[Session]:
        """The sessions the key's latency rests on. A later trial's one steady added round
        does not outweigh a whole measurement of too few steady ones; a session of as many
        steady rounds does."""
        found = self.sessions.get(digest, [])
        counting = [s for s in found if s.counts]
        left_out = [len(s.rounds) for s in found if not s.counts]
        if left_out and sum(len(s.rounds) for s in counting) < max(left_out):
            return found
        return counting

    def adding(
        self, digest: str, rounds: Sequence[Sequence[float]], steady: bool | None = None
    ) -> LatencyTable:
        """This table with a session of `rounds` of `digest` added, as it reads once it is
        recorded (no second read of the storage)."""
        added = Session([list(r) for r in rounds], steady)
        return replace(
            self, sessions={**self.sessions, digest: [*self.sessions.get(digest, []), added]}
        )

    def round_count(self, digest: str) -> int:
        return sum(len(s.rounds) for s in self.sessions.get(digest, []))

    def session_count(self, digest: str) -> int:
        return len(self.sessions.get(digest, []))

    def counted_session_count(self, digest: str) -> int:
        """The sessions that count the key's latency rests on: none while it pools a session
        of too few steady rounds."""
        pooled = self.pooled(digest)
        return len(pooled) if all(s.counts for s in pooled) else 0


def register_keys(
    storage: optuna.storages.BaseStorage, study_id: int, keys: Sequence[Mapping[str, Any]]
) -> None:
    """Write what each key's digest stands for before any session of it exists, so that a
    measuring worker can find a running trial's keys (`tuner.study.measuring`)."""
    for key in keys:
        storage.set_study_user_attr(study_id, f"{_KEY_PREFIX}{digest_of(key)}", dict(key))


def record_given_up(
    storage: optuna.storages.BaseStorage, study_id: int, key: Mapping[str, Any], reason: str
) -> None:
    """Say in the study why the machine a key names could not time it (a backend it does not
    run, a conversion that failed), so that a trial waiting for that machine's latency of it
    (`study.target_machine`) records its point as failed with the reason instead of waiting."""
    digest = digest_of(key)
    storage.set_study_user_attr(study_id, f"{_KEY_PREFIX}{digest}", dict(key))
    storage.set_study_user_attr(study_id, f"{_GIVEN_UP_PREFIX}{digest}", reason)


def record_session(
    storage: optuna.storages.BaseStorage,
    study_id: int,
    key: Mapping[str, Any],
    rounds: Sequence[Sequence[float]],
    steady: bool | None = None,
) -> None:
    """Add one finished measurement session of `key` to the study's table, with whether its
    rounds were steady (`Timed.steady`; not written where they were not judged)."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
    session: dict[str, Any] = {
        "rounds": [[round(value, 4) for value in r] for r in rounds],
        "at": now,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
    }
    if steady is not None:
        session["steady"] = steady
    digest = digest_of(key)
    # The same value whoever writes it: a race between workers changes nothing.
    storage.set_study_user_attr(study_id, f"{_KEY_PREFIX}{digest}", dict(key))
    storage.set_study_user_attr(study_id, f"{_PREFIX}{digest}:{uuid.uuid4().hex[:12]}", session)
