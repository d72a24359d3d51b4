"""A trial's latencies: each backend's key in the study's latency table, what the table already
knows of them, what is timed before training (for a latency budget and early stopping), and the
rounds timed on the trained artifacts."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.deploy import BACKENDS, BackendResult, convert_into
from tuner.latency import LatencyResult, Timed, time_rounds
from tuner.latency import messages as latency_messages
from tuner.models import ModelRecipe
from tuner.store import LatencyTable, digest_of, latency_key, record_session
from tuner.trial import messages, target
from tuner.trial.context import TrialContext

# Backend -> its latency key in the study's table; None for a backend whose graph depends on
# the trained weights (`Backend.follows_weights`): each of its artifacts is timed on its own.
LatencyKeys = Mapping[str, dict[str, Any] | None]


def latency_keys(
    cfg: DictConfig,
    structure: list[list[Any]],
    backends: Sequence[str],
    protocol_record: Mapping[str, Any],
) -> dict[str, dict[str, Any] | None]:
    """Each backend's latency key for a model of `structure` (`latency_table.structure_of`)."""
    return {
        backend: None
        if BACKENDS.get(backend).follows_weights(cfg.deploy)
        else latency_key(cfg.model, structure, backend, cfg.deploy, protocol_record)
        for backend in backends
    }


def from_table(table: LatencyTable, keys: LatencyKeys) -> dict[str, LatencyResult | None]:
    """Each backend's latency as the table has it; None where unknown."""
    return {b: target.known_latency(table, key) for b, key in keys.items()}


def fastest(latencies: Mapping[str, LatencyResult | None], statistic: str) -> float:
    """The smallest known latency (by `statistic`) of a configuration's backends (NaN when none
    is known)."""
    return min(
        (r.ranked_ms(statistic) for r in latencies.values() if r is not None), default=math.nan
    )


def before_training(
    ctx: TrialContext, model: nn.Module, cfg: DictConfig, keys: LatencyKeys, workdir: Path
) -> dict[str, LatencyResult | None]:
    """Backend -> this architecture's latency there, from the study's latency table; keys
    it lacks are measured now on the untrained model, in interleaved rounds. None where the
    untrained model would not convert (the trained one is timed instead)."""
    table = ctx.latency_table()
    missing = [b for b, key in keys.items() if key and table.round_count(digest_of(key)) == 0]
    measured = Timed({})
    if missing:
        model.eval()
        recipe = ModelRecipe.of(cfg.model, ctx.factory.num_labels)
        loaded = {}
        # Conversions and timing must not move the random stream training starts from.
        with torch.random.fork_rng():
            for backend in missing:
                try:
                    loaded[backend] = convert_into(
                        workdir,
                        backend,
                        model,
                        recipe,
                        ctx.example,
                        cfg.deploy,
                        ctx.calibration,
                    ).logits_of
                except Exception as exc:  # timed after training instead
                    messages.untimed_before_training(backend, f"{type(exc).__name__}: {exc}")
            if loaded:
                measured = time_rounds(
                    loaded,
                    ctx.example,
                    ctx.protocol,
                    on_set_aside=latency_messages.rounds_set_aside,
                )
        for backend, timings in measured.rounds.items():
            key = keys[backend]
            assert key is not None
            record_session(ctx.storage, ctx.study_id, key, timings, measured.steady)
            table = table.adding(digest_of(key), timings, measured.steady)
    results = from_table(table, keys)
    messages.latencies_before_training(
        results, measured=list(measured.rounds), statistic=ctx.protocol.statistic
    )
    return results


def with_one_more_round(
    ctx: TrialContext, logits_of, key: Mapping[str, Any] | None
) -> LatencyResult | None:
    """The key's latency from the study's table, with one more round timed on this
    deployed artifact while it has fewer than `max_rounds`; None for a key the table lacks,
    or no key (`first_latencies` measures those)."""
    if key is None:
        return None
    digest, table = digest_of(key), ctx.latency_table()
    have = table.round_count(digest)
    if have == 0:
        return None
    # A target machine's latencies are timed there, never here.
    if have < ctx.protocol.max_rounds and ctx.target_machine is None:
        # Judged as any round, silently: a line per backend's added round would bury the
        # trial's own lines.
        added = time_rounds({"": logits_of}, ctx.example, ctx.protocol, rounds=1)
        record_session(ctx.storage, ctx.study_id, key, added.rounds[""], added.steady)
        table = table.adding(digest, added.rounds[""], added.steady)
    return table.result(digest)


def first_latencies(
    ctx: TrialContext, results: Mapping[str, BackendResult], keys: LatencyKeys
) -> dict[str, BackendResult]:
    """The latencies the table lacks (or does not keep), measured on the trained artifacts
    in rounds interleaved across backends, recorded in the table where the backend has a
    key, and put on their results."""
    waiting = {b: r.logits_of for b, r in results.items() if r.logits_of is not None}
    if not waiting:
        return {}
    if ctx.target_machine is not None:
        return {b: _on_target(ctx, results[b], keys[b]) for b in waiting}
    try:
        measured = time_rounds(
            waiting, ctx.example, ctx.protocol, on_set_aside=latency_messages.rounds_set_aside
        )
    except Exception as exc:  # one backend's failure must not take the others' points
        messages.interleaved_timing_failed(f"{type(exc).__name__}: {exc}")
        measured = Timed({})
    updated, table = {}, ctx.latency_table()
    for backend, logits_of in waiting.items():
        key = keys[backend]
        try:
            alone = (
                measured
                if backend in measured.rounds
                else time_rounds(
                    {backend: logits_of},
                    ctx.example,
                    ctx.protocol,
                    on_set_aside=latency_messages.rounds_set_aside,
                )
            )
            timings = alone.rounds[backend]
            if key is None:
                latency = LatencyResult.of_rounds(timings)
            else:
                record_session(ctx.storage, ctx.study_id, key, timings, alone.steady)
                table = table.adding(digest_of(key), timings, alone.steady)
                latency = table.result(digest_of(key))
        except Exception as exc:
            error = f"timing failed: {type(exc).__name__}: {exc}"
            updated[backend] = replace(results[backend], error=error, logits_of=None)
            continue
        updated[backend] = replace(results[backend], latency=latency, logits_of=None)
    return updated


def _on_target(
    ctx: TrialContext, result: BackendResult, key: Mapping[str, Any] | None
) -> BackendResult:
    """A result given its latency on the target machine (`study.target_machine`), or failed
    with why it has none."""
    latency = target.known_latency(ctx.latency_table(), key)
    if latency is None:
        return replace(result, error=target.why_not_measured(ctx, key), logits_of=None)
    return replace(result, latency=latency, logits_of=None)
