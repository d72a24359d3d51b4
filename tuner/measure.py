"""`python -m tuner.measure +experiment=NAME [overrides] [--follow]`: on the machine that will
serve, time every architecture x backend of a study that this machine has no latency for, under
the study's protocol, into the study's latency table; then publish this machine's front.

The study is found from the same config keys as `python -m tuner` (`+experiment=...`,
`study.name`, `study.storage`, `tracking.uri`, `debug=smoke`); `deploy.machine` names this
machine (default: its host, CPU model and kernel caps). Nothing is trained: a configuration's
architecture is rebuilt untrained (weights do not change speed), converted and timed
(`tuner.study.measuring`). A study with `study.target_machine` set to this machine's name waits
for these measurements before each configuration trains.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tuner import console
from tuner.errors import ConfigError
from tuner.interrupts import Terminated, interruptible
from tuner.quick_exit import quick_exit
from tuner.secrets import mask_urls_in

_DEFAULT_POLL_S = 2.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.measure",
        description=(
            "Time a study's architectures on this machine (no training), filed under "
            "deploy.machine, and publish this machine's front. Positional arguments are the "
            "Hydra overrides that name the study, as given to `python -m tuner`."
        ),
    )
    parser.add_argument(
        "overrides", nargs="*", help="e.g. +experiment=bert_ffn deploy.machine=edge"
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep timing new configurations as training workers start them, until the study "
        "holds its study.n_trials and none runs",
    )
    parser.add_argument(
        "--poll-s",
        type=float,
        default=_DEFAULT_POLL_S,
        metavar="S",
        help=f"with --follow, seconds between two looks at the study (default {_DEFAULT_POLL_S:g})",
    )
    return parser.parse_intermixed_args(argv)


def measure(args: argparse.Namespace) -> int:
    from tuner.front import failures_of, front_of
    from tuner.front import messages as front_messages
    from tuner.study import (
        measuring_worker,
        publish_machine_front,
        recheck_front,
        recheck_note,
        study_over,
    )
    from tuner.tracking import Tracker

    if args.poll_s <= 0:
        raise ConfigError(f"Invalid option --poll-s {args.poll_s}: must be > 0")
    worker = measuring_worker(args.overrides)
    cfg, study, machine = worker.cfg, worker.study, worker.machine
    n_trials = int(cfg.study.n_trials)
    console.console.print(
        f"Measuring study '{study.study_name}' on machine {machine.name}"
        + (" until it ends (--follow)" if args.follow else "")
    )
    worker.measurer.run(args.follow, lambda: study_over(study, n_trials), args.poll_s)
    measured = sum(worker.measurer.timed_here.values())
    given_up = len(worker.measurer.given_up)
    console.console.print(
        f"Timed {measured} latenc{'y' if measured == 1 else 'ies'} on {machine.name}"
        + (f"; {given_up} could not be timed here (said above)" if given_up else "")
    )
    tracker = Tracker(str(cfg.tracking.uri), str(cfg.tracking.experiment))
    constraints = worker.measurer.constraints
    trials = study.get_trials(deepcopy=False)
    here, baseline, _ = front_of(trials, study.user_attrs, constraints, machine)
    tolerance = float(cfg.deploy.agreement_tolerance)
    rechecked = recheck_front(here, worker.splits, tracker.client, machine.name, tolerance)
    publish_machine_front(
        study,
        machine,
        here,
        baseline,
        tracker,
        cfg.study.hypervolume_reference,
        [recheck_note(found, machine.name, tolerance) for found in rechecked],
    )
    console.console.print(f"Latencies on machine {machine.name}:")
    front_messages.front_summary(study.study_name, here, failures_of(trials), baseline, constraints)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console.quiet_libraries()
    try:
        with interruptible():
            return measure(args)
    except ConfigError as exc:
        print(f"error: {mask_urls_in(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        print(
            "Interrupted: every latency timed whole is in the study; the one being timed is "
            "not. Re-run the same command to go on.",
            file=sys.stderr,
        )
        return 143 if isinstance(interrupt, Terminated) else 130


if __name__ == "__main__":
    with quick_exit():
        sys.exit(main())
