"""A noisy neighbour on demand: slow spells of known timing, to measure what a study records
while one comes and goes.

For `--seconds`, busy processes (`--processes`, each streaming a large array through memory on
one core) run for `--on` seconds, then none for `--off` seconds, and so on; each spell's start
and end are printed with the seconds since the script started, so that a study's log can be
laid beside them:

    python scripts/noisy_neighbour.py --seconds 900 --on 40 --off 40 &
    python -m tuner +experiment=bert_ffn

Used in docs/benchmarks.md, "Steady sessions".
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time

import numpy as np

# Larger than any cache: every copy goes through memory, as a neighbour's working set does.
_ARRAY_BYTES = 256 * 1024 * 1024


def _stream() -> None:
    source = np.ones(_ARRAY_BYTES // 8)
    target = np.empty_like(source)
    # Until the spell ends, or the script is gone however it went.
    parent = os.getppid()
    while os.getppid() == parent:
        np.copyto(target, source)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, required=True, help="how long to run")
    parser.add_argument("--on", type=float, default=40.0, help="seconds a spell lasts")
    parser.add_argument("--off", type=float, default=40.0, help="seconds between spells")
    parser.add_argument("--processes", type=int, default=1, help="busy processes in a spell")
    args = parser.parse_args(argv)
    for name in ("seconds", "on", "off"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} {getattr(args, name)}: must be > 0")
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: at least 1")
    # `kill` (SIGTERM) ends a spell as its end does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    started = time.monotonic()

    def elapsed() -> float:
        return time.monotonic() - started

    while elapsed() < args.seconds:
        busy = [multiprocessing.Process(target=_stream, daemon=True) for _ in range(args.processes)]
        try:
            for process in busy:
                process.start()
            print(f"spell on at {elapsed():.1f} s", flush=True)
            time.sleep(max(0.0, min(args.on, args.seconds - elapsed())))
        finally:
            for process in busy:
                if process.is_alive():
                    process.terminate()
                    process.join()
        print(f"spell off at {elapsed():.1f} s", flush=True)
        time.sleep(max(0.0, min(args.off, args.seconds - elapsed())))


if __name__ == "__main__":
    main(sys.argv[1:])
