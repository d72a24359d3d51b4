"""A command ends right after its exit handlers, with its own status, its output flushed, and
without the interpreter's teardown. Each case is a real Python process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Run as a command is: tuner imported first, then what registers exit handlers of its own.
SCRIPT = """\
import atexit, sys
import tuner
from tuner.quick_exit import quick_exit

class TornDown:
    def __del__(self):
        sys.stderr.write("torn down\\n")

kept = TornDown()
atexit.register(lambda: open(sys.argv[1], "w").write("handler ran"))
sys.stdout.write("unflushed output")
{body}
"""


def _run(tmp_path, body: str) -> tuple[subprocess.CompletedProcess, str]:
    marker = tmp_path / "handler"
    script = SCRIPT.format(body=textwrap.dedent(body))
    done = subprocess.run(
        [sys.executable, "-c", script, str(marker)], capture_output=True, text=True, timeout=60
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
    assert done.stdout == "unflushed output"
    assert handler == "handler ran"
    assert done.stderr == stderr


def test_outside_a_command_the_process_exits_as_usual(tmp_path):
    # Imported as a library: the interpreter tears down, the object's finaliser runs.
    done, handler = _run(tmp_path, "sys.exit(4)")
    assert done.returncode == 4
    assert handler == "handler ran"
    assert done.stderr == "torn down\n"


def test_an_unhandled_exception_keeps_the_usual_exit(tmp_path):
    done, handler = _run(tmp_path, "with quick_exit():\n    raise ValueError('broken')")
    assert done.returncode == 1
    assert "ValueError: broken" in done.stderr
    assert done.stderr.endswith("torn down\n")
    assert handler == "handler ran"
