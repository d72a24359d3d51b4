"""Profile a logged point on demand (`python -m tuner.report --profile TRIAL`): its MLflow
model loaded as served, one call at the latency protocol's input shape and threads profiled by
its backend's own profiler, and its graph dumped, as a study records them; and the table that
shows it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import OmegaConf
from rich.table import Table

from tuner.deploy.backends import BACKENDS
from tuner.deploy.pipeline import graph_of, profile_of
from tuner.deploy.serving import load_point_model
from tuner.errors import ConfigError
from tuner.insight import GraphDump, OpProfile, op_class
from tuner.latency import LatencyProtocol, pinned_threads
from tuner.modalities import MODALITIES


@dataclass(frozen=True)
class OnDemand:
    backend: str
    input_shape: str
    profile: OpProfile
    graph: GraphDump | None
    graph_absent: str | None


def profile_logged(
    model_uri: str, items: Sequence[Any], protocol_params: Mapping[str, str]
) -> OnDemand:
    """Profile the model at `model_uri` on inputs made of `items` in the shape its point was
    timed with (`protocol_params`: the point run's `latency.*` params)."""
    # The model's files as served; its artifact and input pipeline loaded as deployment loads
    # them, since profiling times the backend's own callable on tensors.
    served = load_point_model(model_uri).unwrap_python_model()
    backend = BACKENDS.get(served.spec.backend)
    deploy = OmegaConf.create(served.spec.deploy)
    logits_of = backend.load(served.artifact, deploy)
    modality = MODALITIES.get(served.spec.modality).load(served.inputs_dir)
    protocol = LatencyProtocol(
        batch_size=int(protocol_params["latency.batch_size"]),
        seq_len=int(protocol_params.get("latency.seq_len", 0)),
        num_threads=int(protocol_params["latency.num_threads"]),
        warmup=1,
        repeats=1,
    )
    example = modality.example(items, protocol)
    with pinned_threads(protocol.num_threads):
        with torch.inference_mode():
            logits_of(*example.tensors)  # warm-up, as the study's profile follows timing
        profile, no_profile = profile_of(backend, served.artifact, logits_of, example, deploy)
        if profile is None:
            raise ConfigError(f"Invalid option --profile: no profile of this point: {no_profile}")
        graph, absent = graph_of(backend, served.artifact, logits_of, example)
    return OnDemand(served.spec.backend, example.shape(), profile, graph, absent)


# Operators listed by the on-demand table; the rest are summed in one line.
_LISTED_OPS = 15


def op_table(found: OnDemand) -> Table:
    """The profiled call's slowest operators, the rest in one line, and the totals by class."""
    profile = found.profile
    total = profile.total_ms or 1.0
    layout = "-" if found.graph is None else str(found.graph.layout_ops)
    table = Table(
        title=f"{found.backend}, one call on {found.input_shape}: {profile.total_ms:.2f} ms in "
        f"operators, {layout} layout ops in its graph",
        caption=None if found.graph_absent is None else f"No graph: {found.graph_absent}",
    )
    for column in ("op type", "class", "calls", "ms", "share"):
        table.add_column(column, justify="left" if column in ("op type", "class") else "right")
    for op, calls, ms in profile.rows[:_LISTED_OPS]:
        table.add_row(op, op_class(op), str(calls), f"{ms:.3f}", f"{ms / total:.1%}")
    rest = profile.rows[_LISTED_OPS:]
    if rest:
        ms = sum(row[2] for row in rest)
        table.add_row(f"{len(rest)} more", "", "", f"{ms:.3f}", f"{ms / total:.1%}")
    table.add_section()
    for name, ms in profile.by_class_ms().items():
        if ms > 0:
            table.add_row("", name, "", f"{ms:.3f}", f"{ms / total:.1%}")
    return table
