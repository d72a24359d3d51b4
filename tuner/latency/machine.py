"""What this CPU offers, as the backends' availability checks and int8 settings need it."""

from __future__ import annotations

import os
import platform
import re
import socket
from functools import cache
from pathlib import Path

# int8 dot products that accumulate in int32 (no saturating 16-bit intermediate sums).
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
# The flags that decide what a backend is worth here, recorded with every latency.
_RECORDED_FLAGS = re.compile(r"^(avx2|avx512.*|avx_vnni.*|amx.*|fma|f16c|bf16|i8mm|sve.*|asimd.*)$")

# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) in rising order; bf16 kernels start at
# AVX512_CORE_BF16. Later names (AMX, AVX10) all include it.
_ONEDNN_ISAS = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
)
_ONEDNN_BF16 = _ONEDNN_ISAS.index("AVX512_CORE_BF16")


@cache
def cpu_flags() -> frozenset[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return frozenset()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def unknown_cpu_notice() -> str | None:
    """What a study on a CPU whose instruction sets cannot be read assumes (None when they
    can): the lowest common denominator, so nothing is built for instructions it may lack."""
    if cpu_flags():
        return None
    return (
        "this CPU's instruction sets could not be read (no flags in /proc/cpuinfo); it is "
        "treated as the lowest common denominator: int8 weights in 7 bits "
        "(deploy.onnx.int8.reduce_range=auto), bf16 left out"
    )


def isa_flags() -> str:
    """The vector and matrix instruction sets of this CPU, e.g. `avx2 avx512_vnni amx_int8`."""
    return " ".join(sorted(flag for flag in cpu_flags() if _RECORDED_FLAGS.match(flag)))


def has_vnni() -> bool:
    return bool(cpu_flags() & VNNI_FLAGS)


def onednn_isa_cap() -> str | None:
    """The ISA that oneDNN (PyTorch's CPU kernels for bf16 and int8) is capped at by
    ONEDNN_MAX_CPU_ISA (or its old name DNNL_MAX_CPU_ISA), or None when it is not capped."""
    value = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if not value or value.strip().upper() in ("", "ALL", "DEFAULT"):
        return None
    return value.strip().upper()


def native_bf16_unavailable() -> str | None:
    """Why PyTorch cannot compute in bf16 natively here, or None when it can. Without native
    instructions bf16 is emulated and several times slower than fp32."""
    if not cpu_flags() & NATIVE_BF16_FLAGS:
        return "this CPU has no native bf16 instructions (avx512_bf16, amx_bf16 or Arm bf16)"
    cap = onednn_isa_cap()
    if cap in _ONEDNN_ISAS and _ONEDNN_ISAS.index(cap) < _ONEDNN_BF16:
        return f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN below its bf16 kernels (AVX512_CORE_BF16)"
    return None


@cache
def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def kernel_caps() -> dict[str, str]:
    """The caps set on the instruction sets PyTorch's CPU kernels use, oneDNN's
    (`ONEDNN_MAX_CPU_ISA`) and ATen's vectorised ones (`ATEN_CPU_CAPABILITY`): the same CPU
    runs the same model at another speed under them."""
    caps = {"ONEDNN_MAX_CPU_ISA": onednn_isa_cap()}
    caps["ATEN_CPU_CAPABILITY"] = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() or None
    return {name: value for name, value in caps.items() if value is not None}


# What a machine's name may hold: it names a folder of the study's MLflow parent run
# (`pareto/<machine>/`), a file beside it and a tag, so neither a path separator nor a space.
MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MACHINE_NAME_RULE = (
    "must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit (it "
    "names a folder of the study's MLflow run)"
)
# Words of a CPU's model name that tell no two CPUs apart.
_CPU_NOISE = re.compile(r"\((R|TM)\)|\bCPU\b|\bProcessor\b|@.*$", re.IGNORECASE)


def default_machine_name() -> str:
    """This machine's name when `deploy.machine` gives none: the host, the CPU model and any
    cap on its kernels' instruction sets (`vm-intel-xeon`, `vm-intel-xeon-avx2`), as a
    machine name may spell them."""
    cpu = _CPU_NOISE.sub(" ", cpu_model())
    caps = " ".join(kernel_caps().values())
    text = f"{socket.gethostname().split('.')[0]} {cpu} {caps}".lower()
    name = re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:64].rstrip("-")
    return name or "machine"


def machine_name(typed: str | None) -> str:
    """The name this machine's latencies are filed under: `deploy.machine`, or the default."""
    return default_machine_name() if typed is None else str(typed)
