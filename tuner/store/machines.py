"""The machines a study's latencies are measured on, by name (`deploy.machine`).

Every worker records its machine when it starts: its name, host and protocol record (CPU model,
instruction sets, kernel caps, library versions, the protocol). A point's latency key names the
machine it was timed on; the same key under another machine's record (`key_on`) is that point's
latency key there, so any command can read a point's latency on any recorded machine, and a
measuring worker (`python -m tuner.measure`) knows which keys its machine still lacks.
"""

from __future__ import annotations

import datetime
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from tuner.keys import MACHINE_ATTR_PREFIX

# The protocol record's field that holds the machine's name.
MACHINE_FIELD = "latency.machine"


@dataclass(frozen=True)
class Machine:
    """A machine as a worker on it recorded it: its name, the host it ran on, its protocol
    record (`protocol_record_of`) and when."""

    name: str
    host: str
    record: dict[str, Any]
    at: str

    def describe(self) -> str:
        """`Intel Xeon ... (avx2 avx512_vnni amx_int8; ONEDNN_MAX_CPU_ISA=AVX2) on host vm`."""
        caps = self.record.get("latency.kernel_caps") or {}
        held = "; ".join(f"{name}={value}" for name, value in caps.items())
        flags = str(self.record.get("latency.cpu_flags", "")) or "flags unknown"
        return (
            f"{self.record.get('latency.cpu', 'an unknown CPU')} ({flags}"
            f"{'; ' + held if held else ''}) on host {self.host}"
        )


def record_machine(
    storage: optuna.storages.BaseStorage, study_id: int, protocol_record: Mapping[str, Any]
) -> tuple[Machine, Machine | None]:
    """Record this worker's machine in the study under its name; returns it, and the record
    it replaces where that one differs in what decides a latency (another CPU, cap or library
    version under the same name), else None."""
    name = str(protocol_record[MACHINE_FIELD])
    earlier = machines_in(storage.get_study_user_attrs(study_id)).get(name)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    machine = Machine(name, socket.gethostname(), dict(protocol_record), now)
    value = {"host": machine.host, "record": machine.record, "at": now}
    storage.set_study_user_attr(study_id, f"{MACHINE_ATTR_PREFIX}{name}", value)
    # Compared as stored (JSON), so tuples and lists read alike.
    if earlier is not None and earlier.record != json.loads(json.dumps(machine.record)):
        return machine, earlier
    return machine, None


def machines_in(user_attrs: Mapping[str, Any]) -> dict[str, Machine]:
    """The study's machines by name, as last recorded."""
    return {
        name[len(MACHINE_ATTR_PREFIX) :]: Machine(
            name[len(MACHINE_ATTR_PREFIX) :],
            str(value.get("host", "")),
            dict(value.get("record", {})),
            str(value.get("at", "")),
        )
        for name, value in user_attrs.items()
        if name.startswith(MACHINE_ATTR_PREFIX) and isinstance(value, dict)
    }
