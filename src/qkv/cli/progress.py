"""Progress bars on stderr for commands that take more than a few seconds.

The library reports progress through a plain callback, `progress(stage, done, total)` (e.g.
[`qkv.explain.causal.faithfulness.faithfulness`][qkv.explain.causal.faithfulness.faithfulness],
[`qkv.explain.causal.head_effects.head_effects`][qkv.explain.causal.head_effects.head_effects]);
`Bars` is that callback drawn with rich: one bar per stage, on stderr, and nothing at all when
stderr is not a terminal or the command prints `--json` — a pipe or a log gets only the command's
own lines.

Examples:
    >>> with Bars(enabled=False) as bars:                 # what --json gives: draws nothing
    ...     bars("ablating", 3, 10)

`drawn` is that rule alone, for the training loop's own bar (tqdm): `qkv train … --quiet`
or a pipe, no bar (the evaluation lines still go to stderr).
"""

from __future__ import annotations


def drawn(enabled: bool = True, console=None) -> bool:
    """Whether progress is drawn: `enabled` (not `--json`, not `--quiet`) and stderr (or
    `console`) a terminal."""
    if not enabled:
        return False
    if console is None:
        from rich.console import Console

        console = Console(stderr=True)
    return console.is_terminal


class Bars:
    """`progress(stage, done, total)` drawn as rich bars on stderr, one per stage (a spinner,
    done/total, the time taken and the time left), cleared when the work is done.

    Args:
        enabled: False draws nothing (`--json`).
        console: where to draw (default: a rich console on stderr; drawn only when it is a
            terminal).
    """

    def __init__(self, *, enabled: bool = True, console=None):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                   TextColumn, TimeElapsedColumn, TimeRemainingColumn)

        console = console if console is not None else Console(stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description:<10}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=True,
                                 disable=not drawn(enabled, console))
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> "Bars":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total)
        self.progress.update(self.tasks[stage], completed=done, total=total)
