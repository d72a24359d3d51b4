"""The commands' exit: once every exit handler has run, the process ends without the
interpreter's teardown.

Tearing down torch, OpenVINO, ONNX Runtime, NNCF and MLflow module by module takes 1-3 s at the
end of every `python -m tuner`, `tuner.report` and `tuner.measure` (a quarter of a refused
command's time), and nothing of tuner's is written in it: by then non-daemon threads have been
joined and the exit handlers have ended MLflow's runs, flushed the logs and removed temporary
directories. What the C libraries buffered on stdout and stderr is flushed before the end.

`_end_now` is registered when the package is first imported; handlers run last-registered first,
so it runs after every handler registered since. One registered before it (a `sitecustomize`, a
coverage start-up hook) would be skipped: then the process exits as usual.
Code that imports tuner as a library never enters `quick_exit`, and exits as usual.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# The exit status of the command run under `quick_exit`, once it has ended.
_command_status: list[int] = []
# CPython's count of exit handlers; none registered before ours means none is skipped. Without
# it (another interpreter), the exit is the usual one.
_FIRST_HANDLER = getattr(atexit, "_ncallbacks", lambda: -1)() == 0


@contextmanager
def quick_exit() -> Iterator[None]:
    """Around a command's main: the process ends with its exit status right after the exit
    handlers. An exception other than SystemExit leaves the usual exit (traceback, status 1, or
    death by the signal for an unhandled Ctrl-C)."""
    try:
        yield
    except SystemExit as exc:
        # As the interpreter reads it: None is success, a message (printed before the exit
        # handlers run) is status 1.
        code = exc.code
        _command_status.append(0 if code is None else code if isinstance(code, int) else 1)
        raise
    _command_status.append(0)


def _end_now() -> None:
    if not _command_status:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C's stdio buffers: all of them
    os._exit(_command_status[-1])


if _FIRST_HANDLER:
    atexit.register(_end_now)
