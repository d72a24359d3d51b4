"""The tests' commands started warm: `python -m tuner` (and `tuner.report`, `tuner.measure`),
the scripts under `scripts/` and `python -c CODE`, forked from a server that has already imported
tuner, torch, transformers and MLflow instead of a new interpreter importing them again (3-5 s of
every command, most of a refused command's time).

    import warm    # warm.run and warm.Popen take subprocess's arguments; it stands in for
                   # subprocess in a script's module too (monkeypatch its `subprocess`);
                   # warm.wait_for_files waits for the files a command writes as it goes

A warm command is still a process of its own: its own pid, arguments, working directory,
environment, standard streams, signals and exit status, started as `python -m`, `python -c` or
`python SCRIPT` would start it. It ends as tuner's commands end (`tuner.quick_exit`): its exit
handlers run, then the process ends without tearing the libraries down. What it cannot have is
something a library reads as it is imported, so a command whose environment differs from the
tests' in anything but the variables read at run time (`WARM_VARIABLES`) starts a new
interpreter, as does any other program; `TUNER_TESTS_COLD=1` starts every command in a new
interpreter. A test that looks at what a new interpreter imports or how it ends uses subprocess.

A warm command starts its own commands (`subprocess.run`) warm too, by the same rules.
The server, `tests/warm_server.py`, is started on first use and ends with the tests.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from subprocess import DEVNULL, PIPE, STDOUT, CompletedProcess, TimeoutExpired  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
MODULES = ("tuner", "tuner.report", "tuner.measure")
# Variables read when used, not when a library is imported; PYTHONUNBUFFERED is applied to the
# child's streams as the interpreter would.
WARM_VARIABLES = ("TUNER_", "HYDRA_FULL_ERROR", "MLFLOW_", "PG", "PYTHONUNBUFFERED")
HEADER = 8  # bytes: the length of the request that follows
# subprocess's own, which a warm command has in place of `subprocess.run`.
_cold_popen, _cold_run = subprocess.Popen, subprocess.run


class _Server:
    """The running server, started on first use."""

    process: subprocess.Popen | None = None
    path = ""
    log = Path()
    lock = threading.Lock()

    @classmethod
    def start(cls) -> None:
        with cls.lock:
            if not cls.path:  # (a warm command has its server's)
                folder = Path(tempfile.mkdtemp(prefix="tuner-warm-"))
                atexit.register(shutil.rmtree, folder, True)  # the socket and the server's log
                cls.path, cls.log = str(folder / "socket"), folder / "server.log"
                with cls.log.open("wb") as log:
                    cls.process = subprocess.Popen(
                        [sys.executable, str(Path(__file__).parent / "warm_server.py"), cls.path],
                        stdin=subprocess.PIPE,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # a signal to the tests' process group spares it
                    )

    @classmethod
    def address(cls) -> str:
        cls.start()
        with cls.lock:
            deadline = time.monotonic() + 120
            while not os.path.exists(cls.path):
                if cls.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the warm server did not start:\n{cls.log.read_text()}")
                time.sleep(0.05)
            return cls.path


def start() -> None:
    """Start the server now, without waiting for it, so that its imports overlap other work;
    the first warm command waits for what is left of them."""
    if os.environ.get("TUNER_TESTS_COLD") != "1":
        _Server.start()


def pytest_collection_finish(session) -> None:
    """A pytest hook (conftest imports it): the server starts as soon as the tests are
    collected, and its imports overlap the tests before the first warm command."""
    if session.items and not session.config.option.collectonly:
        start()


def _warm(command: list[str], env: dict[str, str] | None) -> bool:
    if os.environ.get("TUNER_TESTS_COLD") == "1" or len(command) < 2:
        return False
    if command[0] != sys.executable:
        return False
    if command[1] == "-m":
        known = len(command) > 2 and command[2] in MODULES
    elif command[1] == "-c":
        known = len(command) > 2
    else:
        known = Path(command[1]).resolve().parent == SCRIPTS and command[1].endswith(".py")
    if not known:
        return False
    given = os.environ if env is None else env
    changed = {k for k in {*given, *os.environ} if given.get(k) != os.environ.get(k)}
    return all(name.startswith(WARM_VARIABLES) for name in changed)


class WarmProcess:
    """A warm command, as subprocess.Popen shows one."""

    def __init__(self, command, *, cwd=None, env=None, stdin=None, stdout=None, stderr=None,
                 text=False, start_new_session=False) -> None:  # fmt: skip
        self.args = command
        self.returncode: int | None = None
        self._buffer = b""
        mine, theirs = [], []  # pipe ends kept here, ends handed to the child

        def stream(given, default_fd: int, reading: bool):
            if given == subprocess.PIPE:
                read, write = os.pipe()
                mine.append(read if not reading else write)
                theirs.append(write if not reading else read)
                return theirs[-1], mine[-1]
            if given == subprocess.DEVNULL or (given is None and reading):
                fd = os.open(os.devnull, os.O_RDWR)
                theirs.append(fd)
                return fd, None
            if given is None:
                return default_fd, None
            return (given if isinstance(given, int) else given.fileno()), None

        child_in, self_in = stream(stdin, 0, True)
        child_out, self_out = stream(stdout, 1, False)
        if stderr == subprocess.STDOUT:
            child_err, self_err = child_out, None
        else:
            child_err, self_err = stream(stderr, 2, False)
        request = {
            "command": list(map(str, command)),
            "cwd": str(cwd or os.getcwd()),
            "env": dict(os.environ if env is None else env),
            "new_session": start_new_session,
        }
        payload = json.dumps(request).encode()
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(_Server.address())
        socket.send_fds(
            self._socket,
            [str(len(payload)).zfill(HEADER).encode()],
            [child_in, child_out, child_err],
        )
        self._socket.sendall(payload)
        for fd in theirs:
            os.close(fd)
        mode = "" if text else "b"
        self.stdin = os.fdopen(self_in, "w" + mode) if self_in is not None else None
        self.stdout = os.fdopen(self_out, "r" + mode) if self_out is not None else None
        self.stderr = os.fdopen(self_err, "r" + mode) if self_err is not None else None
        self.pid = int(self._line(None).split()[1])

    def _line(self, timeout: float | None) -> str | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._socket], [], [], left)[0]:
                return None
            chunk = self._socket.recv(64)
            if not chunk:
                raise RuntimeError("the warm server ended before the command")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        return self._wait(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def _wait(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            line = self._line(timeout)
            if line is not None:
                self.returncode = int(line.split()[1])
                self._socket.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input=None, timeout: float | None = None):
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        read: dict[str, object] = {}

        def drain(name: str, stream) -> None:
            read[name] = stream.read()
            stream.close()

        readers = [
            threading.Thread(target=drain, args=(name, stream), daemon=True)
            for name, stream in (("out", self.stdout), ("err", self.stderr))
            if stream is not None
        ]
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return read.get("out"), read.get("err")

    def __enter__(self) -> WarmProcess:
        return self

    def __exit__(self, *exc) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def Popen(command, **options):  # noqa: N802 - subprocess's name, for a one-word swap
    """subprocess.Popen, warm where the command allows."""
    if not _warm(command, options.get("env")):
        return _cold_popen(command, **options)
    return WarmProcess(command, **options)


def run(command, *, capture_output=False, timeout=None, check=False, input=None, **options):
    """subprocess.run, warm where the command allows."""
    if not _warm(command, options.get("env")):
        return _cold_run(
            command, capture_output=capture_output, timeout=timeout, check=check, input=input,
            **options,
        )  # fmt: skip
    if capture_output:
        options.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if input is not None:
        options["stdin"] = subprocess.PIPE
    process = WarmProcess(command, **options)
    try:
        out, err = process.communicate(input, timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    result = subprocess.CompletedProcess(command, process.returncode, out, err)
    if check:
        result.check_returncode()
    return result


def wait_for_files(*paths: Path, processes=(), what: str, any_of: bool = False) -> None:
    """Until every one of `paths` (or, `any_of`, one) exists and has been written; fails if one
    of `processes` ends first, or after 120 s."""
    deadline = time.monotonic() + 120
    written = any if any_of else all
    while not written(path.exists() and path.stat().st_size for path in paths):
        assert all(p.poll() is None for p in processes), f"a worker ended before {what}"
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.01)
