"""How latency is measured (the protocol, timed rounds, steadiness) and the machine it is
measured on (CPU flags, peaks, memory)."""

from __future__ import annotations

from tuner.latency.machine import (
    MACHINE_NAME,
    MACHINE_NAME_RULE,
    has_vnni,
    isa_flags,
    machine_name,
    native_bf16_unavailable,
    unknown_cpu_notice,
)
from tuner.latency.memory import track_peak_memory
from tuner.latency.peak import flops_per_call, measure_peak, study_peak
from tuner.latency.protocol import (
    DEFAULT_STATISTIC,
    LATENCY_STATISTICS,
    STATISTIC_KEY,
    LatencyProtocol,
    LatencyResult,
    Timed,
    cpu_model,
    gpu_record,
    measure_latency,
    objective_name,
    pinned_threads,
    time_rounds,
    wait_for_steady,
)
from tuner.latency.steadiness import fastest_call_ms, forget_readings, reference_for, steady_rounds

__all__ = [
    "DEFAULT_STATISTIC",
    "LATENCY_STATISTICS",
    "MACHINE_NAME",
    "MACHINE_NAME_RULE",
    "LatencyProtocol",
    "LatencyResult",
    "STATISTIC_KEY",
    "Timed",
    "cpu_model",
    "fastest_call_ms",
    "flops_per_call",
    "forget_readings",
    "gpu_record",
    "has_vnni",
    "isa_flags",
    "machine_name",
    "measure_latency",
    "measure_peak",
    "native_bf16_unavailable",
    "objective_name",
    "pinned_threads",
    "reference_for",
    "steady_rounds",
    "study_peak",
    "time_rounds",
    "track_peak_memory",
    "unknown_cpu_notice",
    "wait_for_steady",
]
