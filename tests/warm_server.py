"""The server of the tests' warm commands (`tests/warm.py`): `python tests/warm_server.py SOCKET`
imports what the commands import, then forks a child per request on SOCKET, which becomes the
command. It ends when its standard input closes (the tests have ended). It forks before any
library has computed anything, from its only Python thread, as a DataLoader forks its workers.
"""

from __future__ import annotations

import io
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import types
from pathlib import Path

import warm
from mlflow_stores import stores_from_template

# What the commands import: the server imports it once (but never the commands' own modules,
# which run as __main__).
PRELOADED = (
    "tuner.config",
    "tuner.study",
    "tuner.report_export",
    "tuner.deploy",
    "transformers.models.bert.modeling_bert",
    "mlflow.store.tracking.sqlalchemy_store",
    "onnx",
    "matplotlib.pyplot",
    "plotly.graph_objects",
)


def _serve(path: str) -> dict:
    """Fork a child per request; return the request in the child, never in the server."""
    import importlib

    for module in PRELOADED:
        importlib.import_module(module)
    stores_from_template(Path(path).parent)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    waiting = selectors.DefaultSelector()
    waiting.register(listener, selectors.EVENT_READ)
    waiting.register(sys.stdin, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while True:
        for key, _ in waiting.select(timeout=0.05):
            if key.fileobj is sys.stdin:  # the tests have ended
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                os._exit(0)
            connection, _ = listener.accept()
            request, fds = _receive(connection)
            pid = os.fork()
            if pid == 0:
                waiting.close()
                for held in (listener, connection, *children.values()):
                    held.close()
                _become(request, fds)
                return request
            for fd in fds:
                os.close(fd)
            connection.sendall(f"pid {pid}\n".encode())
            children[pid] = connection
        _reap(children)


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(connection, warm.HEADER, 3)
    size = int(header.decode())
    payload = b""
    while len(payload) < size:
        payload += connection.recv(size - len(payload))
    return json.loads(payload), fds


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid)
        try:
            connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
        except OSError:  # the tests stopped waiting
            pass
        connection.close()


def _become(request: dict, fds: list[int]) -> None:
    """In the child: take the command's streams, place, environment and arguments."""
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(open(0, "rb", closefd=False))
    sys.stdout = sys.__stdout__ = _stream(1, sys.stdout, unbuffered, os.isatty(1))
    sys.stderr = sys.__stderr__ = _stream(2, sys.stderr, unbuffered, True)
    option, *rest = request["command"][1:]
    # As the interpreter sets them for `-m MODULE`, `-c CODE` and `SCRIPT`.
    sys.path[0] = {"-m": os.getcwd(), "-c": ""}.get(option, str(Path(option).parent))
    sys.argv = [option, *rest[1:]] if option in ("-m", "-c") else [option, *rest]


def _stream(fd: int, like: io.TextIOWrapper, unbuffered: bool, line_buffered: bool):
    raw = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
    return io.TextIOWrapper(
        raw,
        encoding=like.encoding,
        errors=like.errors,
        line_buffering=line_buffered and not unbuffered,
        write_through=unbuffered,
    )


def _main() -> None:
    # The package first, as `python -m tuner` imports it, before any library: its exit handler
    # then runs after theirs.
    from tuner.quick_exit import quick_exit

    path = sys.argv[1]
    request = _serve(path)
    option, *rest = request["command"][1:]
    # The command's own commands (`subprocess.run`: a script's studies) are forked from this
    # server too.
    warm._Server.path = path
    subprocess.run = warm.run
    # Every command ends as tuner's do, without tearing down the libraries the server
    # imported (2 s), which a command started cold would tear down only if it imported them.
    with quick_exit():
        if option == "-m":
            runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        elif option == "-c":
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(rest[0], "<string>", "exec"), main.__dict__)
        else:
            runpy.run_path(option, run_name="__main__")


if __name__ == "__main__":
    _main()
