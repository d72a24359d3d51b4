"""What a study keeps in Optuna's storage: the storage itself (with retries of what is safe to
repeat), the names of its attributes, settings, budget, leases, requeue, the latency table."""

from __future__ import annotations

from tuner.store.budget import is_configuration, retried_numbers
from tuner.store.data_settings import CurrentSplit, current_split, data_changes, data_fingerprint
from tuner.store.latency_table import (
    LatencyTable,
    digest_of,
    key_on,
    latency_key,
    measured_alike,
    record_given_up,
    record_session,
    register_keys,
    stored_key,
    structure_of,
)
from tuner.store.lease import LeaseHeld, Leases
from tuner.store.machines import MACHINE_FIELD, Machine, machines_in, record_machine
from tuner.store.optuna_compat import (
    FilteredSampler,
    completed_copy,
    heartbeat_of,
    is_heartbeat_enabled,
    storage_of,
    study_id_of,
    trial_id_of,
)
from tuner.store.requeue import died, requeue
from tuner.store.retries import (
    RETRY_SECONDS,
    RetryingProxy,
    call_with_retries,
    error_line,
    is_transient,
)
from tuner.store.settings import (
    DIRECTIONS,
    check_change_keys,
    covered,
    settings_of,
    settle,
    stored_settings,
    subtree,
    typed_contradiction,
)
from tuner.store.storage import (
    Heartbeat,
    beat_for_unbeaten,
    is_sqlite,
    open_storage,
)

__all__ = [
    "CurrentSplit",
    "DIRECTIONS",
    "FilteredSampler",
    "Heartbeat",
    "LatencyTable",
    "MACHINE_FIELD",
    "LeaseHeld",
    "Leases",
    "Machine",
    "RETRY_SECONDS",
    "RetryingProxy",
    "beat_for_unbeaten",
    "call_with_retries",
    "check_change_keys",
    "completed_copy",
    "covered",
    "current_split",
    "data_changes",
    "data_fingerprint",
    "died",
    "digest_of",
    "heartbeat_of",
    "is_configuration",
    "is_heartbeat_enabled",
    "is_sqlite",
    "error_line",
    "is_transient",
    "key_on",
    "latency_key",
    "machines_in",
    "measured_alike",
    "open_storage",
    "record_given_up",
    "record_machine",
    "record_session",
    "register_keys",
    "requeue",
    "retried_numbers",
    "settings_of",
    "settle",
    "storage_of",
    "stored_key",
    "stored_settings",
    "structure_of",
    "study_id_of",
    "subtree",
    "trial_id_of",
    "typed_contradiction",
]
