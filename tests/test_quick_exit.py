"""A command ends right after its exit handlers, with its own status, its output flushed, and
without the interpreter's teardown. Each case is a real Python process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# As a command runs: tuner imported first, then what registers exit handlers of its own. The
# object's finaliser runs only in the interpreter's teardown.
SCRIPT = """\
import atexit, ctypes, sys
{before}
import tuner
from tuner.quick_exit import quick_exit

class TornDown:
    def __del__(self):
        sys.stderr.write("torn down\\n")

kept = TornDown()
atexit.register(lambda: open(sys.argv[1], "w").write("handler ran"))
sys.stdout.write("unflushed output, ")
ctypes.CDLL(None).printf(b"and from C")
{body}
"""
# Python's and C's stdout buffered, as when a command's output goes to a pipe or a file.
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _both_flushed(stdout: str) -> bool:
    """Python's and C's buffered output, each whole, in whichever order they were flushed."""
    return stdout in ("unflushed output, and from C", "and from Cunflushed output, ")


def _run(tmp_path, body: str, before: str = "") -> tuple[subprocess.CompletedProcess, str]:
    marker = tmp_path / "handler"
    script = SCRIPT.format(before=before, body=textwrap.dedent(body))
    done = subprocess.run(
        [sys.executable, "-c", script, str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        env=BUFFERED,
    )
    return done, marker.read_text() if marker.exists() else ""


@pytest.mark.parametrize(
    ("body", "status", "stderr"),
    [
        ("with quick_exit():\n    sys.exit(3)", 3, ""),
        ("with quick_exit():\n    pass", 0, ""),
        ("with quick_exit():\n    sys.exit(None)", 0, ""),
        # A message is printed, before the exit handlers, and means status 1.
        ("with quick_exit():\n    sys.exit('bad value')", 1, "bad value\n"),
    ],
    ids=["status", "return", "none", "message"],
)
def test_a_command_ends_with_its_status_after_its_exit_handlers_without_teardown(
    tmp_path, body, status, stderr
):
    done, handler = _run(tmp_path, body)
    assert done.returncode == status
    assert _both_flushed(done.stdout), done.stdout
    assert handler == "handler ran"
    assert done.stderr == stderr


def test_outside_a_command_the_process_exits_as_usual(tmp_path):
    # Imported as a library: the interpreter tears down, the object's finaliser runs.
    done, handler = _run(tmp_path, "sys.exit(4)")
    assert done.returncode == 4 and _both_flushed(done.stdout), done.stdout
    assert handler == "handler ran"
    assert done.stderr == "torn down\n"


def test_an_unhandled_exception_keeps_the_usual_exit(tmp_path):
    done, handler = _run(tmp_path, "with quick_exit():\n    raise ValueError('broken')")
    assert done.returncode == 1
    assert "ValueError: broken" in done.stderr
    assert done.stderr.endswith("torn down\n")
    assert handler == "handler ran"


def test_a_handler_registered_before_tuner_keeps_the_usual_exit(tmp_path):
    # It would run after the quick exit's, so it would be skipped: the exit is the usual one.
    early = "atexit.register(lambda: sys.stderr.write('early handler ran\\n'))"
    done, handler = _run(tmp_path, "with quick_exit():\n    sys.exit(5)", before=early)
    assert (done.returncode, handler) == (5, "handler ran")
    assert done.stderr == "early handler ran\ntorn down\n"


# Slow: each command imports what it runs (PyTorch, Hydra, MLflow) in a new interpreter, 3-5 s.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "args", "status"),
    [("tuner", [], 2), ("tuner.report", ["--help"], 0), ("tuner.measure", ["--help"], 0)],
)
def test_each_command_exits_quickly(command, args, status):
    # Run as `python -m COMMAND ARGS`, with an object only the teardown would finalise.
    script = (
        "import runpy, sys, tuner\n"
        "class TornDown:\n"
        "    def __del__(self):\n"
        "        sys.stderr.write('torn down')\n"
        "kept = TornDown()\n"
        f"sys.argv = [{command!r}, *{args!r}]\n"
        f"runpy.run_module({command!r}, run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == status, done.stderr
    assert "torn down" not in done.stderr
