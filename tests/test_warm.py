"""Warm commands (`tests/warm.py`) behave as the same commands started by a new interpreter:
each case runs one command both ways and compares what a test can see of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import warm

pytestmark = pytest.mark.skipif(
    os.environ.get("TUNER_TESTS_COLD") == "1", reason="TUNER_TESTS_COLD=1: no command starts warm"
)

PROBE = textwrap.dedent(
    """
    import json, os, sys
    line = sys.stdin.readline()
    print(json.dumps({
        "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "read": line,
        "variable": os.environ.get("TUNER_PROBE"), "main": __name__,
    }))
    print("to stderr", file=sys.stderr)
    """
)


def _both(command, **options):
    """(cold, warm) subprocess.run results of `command`."""
    cold = subprocess.run(command, capture_output=True, text=True, timeout=60, **options)
    warmed = warm.run(command, capture_output=True, text=True, timeout=60, **options)
    return cold, warmed


def _is_warm(env=None) -> bool:
    """Whether a `python -c` command with `env` is forked by the server (its parent) rather
    than started by this process."""
    command = [sys.executable, "-c", "import os; print(os.getppid())"]
    done = warm.run(command, capture_output=True, text=True, timeout=60, env=env)
    return int(done.stdout) != os.getpid()


def test_code_sees_the_same_arguments_place_input_environment_and_streams(tmp_path):
    env = {**os.environ, "TUNER_PROBE": "given"}
    command = [sys.executable, "-c", PROBE, "one", "two"]
    cold, warmed = _both(command, cwd=tmp_path, env=env, input="typed\n")
    assert (warmed.returncode, warmed.stdout, warmed.stderr) == (
        cold.returncode,
        cold.stdout,
        cold.stderr,
    )
    assert '"argv": ["-c", "one", "two"]' in cold.stdout and cold.stderr == "to stderr\n"


# Slow: a new interpreter imports PyTorch for each command (3-5 s each on 2 cores).
@pytest.mark.slow
def test_a_script_and_a_module_print_the_same(tmp_path):
    # argparse names the program after sys.argv[0]; Hydra lists the config groups.
    script = [sys.executable, str(warm.SCRIPTS / "bench_heads.py"), "--help"]
    printed = []
    for command in (script, [sys.executable, "-m", "tuner", "--help"]):
        cold, warmed = _both(command, cwd=tmp_path)
        assert warmed.returncode == cold.returncode == 0
        assert warmed.stdout == cold.stdout and warmed.stderr == cold.stderr
        printed.append(cold.stdout)
    assert printed[0].startswith("usage: bench_heads.py") and "experiment:" in printed[1]


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("import sys; sys.exit(3)", 3),
        ("import sys; sys.exit('a message')", 1),
        ("raise ValueError('boom')", 1),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
        ("import atexit; atexit.register(print, 'handler ran')", 0),
    ],
)
def test_a_command_ends_with_the_same_status_and_last_words(code, status):
    cold, warmed = _both([sys.executable, "-c", code])
    assert cold.returncode == warmed.returncode == status
    # Tracebacks name the same lines; the message and the handler's output are the same.
    assert warmed.stdout == cold.stdout
    assert warmed.stderr.splitlines()[-1:] == cold.stderr.splitlines()[-1:]


def test_a_signal_reaches_the_command_and_its_output_arrives_as_written():
    code = "import time\nprint('ready')\ntime.sleep(60)"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = warm.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    # Unbuffered: the line arrives while the command still runs.
    assert process.stdout.readline() == "ready\n"
    assert process.poll() is None
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    assert time.monotonic() - started < 10
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)


def test_only_variables_read_at_run_time_keep_a_command_warm():
    assert _is_warm()
    assert _is_warm({**os.environ, "TUNER_PROBE": "x", "PYTHONUNBUFFERED": "1"})
    # Read as libraries are imported, so the command needs a new interpreter.
    assert not _is_warm({**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert not _is_warm({**os.environ, "HF_HUB_OFFLINE": "1"})


# A command that starts a command and prints its own pid, then the pid of that command's parent
# and what that command printed.
NESTED = textwrap.dedent(
    """
    import os, subprocess, sys
    inner = "import os, sys; print(os.getppid()); print(sys.argv[1:])"
    done = subprocess.run(
        [sys.executable, "-c", inner, "given"], capture_output=True, text=True, env=ENV
    )
    print(os.getpid(), done.returncode, *done.stdout.split(chr(10))[:2])
    """
)


def test_a_warm_command_starts_its_own_commands_warm_by_the_same_rules():
    cold = subprocess.run(
        [sys.executable, "-c", NESTED.replace("ENV", "None")], capture_output=True, text=True
    )
    pid, status, parent, printed = cold.stdout.split(" ", 3)
    # Started cold: the inner command is its child.
    assert (status, parent, printed) == ("0", pid, "['given']\n")
    warmed = warm.run(
        [sys.executable, "-c", NESTED.replace("ENV", "None")], capture_output=True, text=True
    )
    pid, status, parent, printed = warmed.stdout.split(" ", 3)
    # Started warm: the inner command is forked from the server, as the outer one was.
    assert (status, printed) == ("0", "['given']\n") and parent != pid
    assert parent == str(warm._Server.process.pid)
    # An environment read as libraries are imported starts it cold, from the outer command.
    capped = NESTED.replace("ENV", '{**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}')
    warmed = warm.run([sys.executable, "-c", capped], capture_output=True, text=True)
    pid, status, parent, printed = warmed.stdout.split(" ", 3)
    assert (status, parent, printed) == ("0", pid, "['given']\n")
