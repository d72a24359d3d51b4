"""The benchmark scripts run end to end on small settings and print their table."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_bench_backends_prints_a_row_per_backend():
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "bench_backends.py"),
            "--ffn-width",
            "512",
            "--backends",
            "eager",
            "int8_dynamic",
            "--train-samples",
            "64",
            "--val-samples",
            "32",
            "--rounds",
            "1",
            "--repeats",
            "2",
            "--seq-len",
            "32",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    names = [row.split("|")[1].strip() for row in rows[1:]]
    assert names == ["---", "eager fp32, full width", "eager", "int8_dynamic"]
    eager = rows[3].split("|")
    assert float(eager[6]) > 0  # artifact size in MB
    assert eager[7].strip() == "100.0%"  # eager agrees with itself
