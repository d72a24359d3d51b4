"""What latency measurement says on the terminal."""

from __future__ import annotations

from tuner.console import console


def rounds_set_aside(set_aside: int, timed: int) -> None:
    console.print(
        f"  [dim]{set_aside} of {timed} timed rounds set aside: the machine reference read a "
        "slow spell around them (deploy.latency.steady_within)[/]"
    )
