"""The training curves of `qkv train lm`: losses and the best induction score per evaluation.

The phase change shows as the copied-word loss falling away from the random-word loss at the
step where an induction head's score jumps (Olsson et al., 2022, fig. "phase change").
"""

from __future__ import annotations

from matplotlib.figure import Figure


def training_curves(history: list[dict], *, appeared: int | None = None) -> Figure:
    """A two-panel figure from a run's `history` (config.json `qkv_training.history`).

    Top: validation loss on copied words (predictable by induction) and on random words, and
    the training loss. Bottom: the best induction and previous-token head score, and chance.
    `appeared`: the step to mark as the induction heads' appearance.

    Examples:
        >>> h = [{"step": 100, "train_loss": 4.1, "copy_loss": 4.0, "random_loss": 4.2,
        ...       "induction": [[0.1]], "previous_token": [[0.2]]}]
        >>> len(training_curves(h).axes)
        2
    """
    steps = [h["step"] for h in history]
    fig = Figure(figsize=(7.5, 5.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(steps, [_nan_if_none(h["copy_loss"]) for h in history], label="copied words (need induction)")
    top.plot(steps, [_nan_if_none(h["random_loss"]) for h in history], label="random words (ln 256 at best)")
    top.plot(steps, [h["train_loss"] for h in history], label="training batch", alpha=0.5)
    top.set_ylabel("loss (nats)")
    top.legend(loc="upper right", fontsize=8)
    top.set_title("qkv train lm: loss and induction score per evaluation")
    bottom.plot(steps, [max(map(max, h["induction"])) for h in history], label="best induction score")
    bottom.plot(steps, [max(map(max, h["previous_token"])) for h in history],
                label="best previous-token score")
    bottom.set_ylabel("attention on target")
    bottom.set_xlabel("training step")
    bottom.set_ylim(0, 1)
    if appeared is not None:
        for ax in (top, bottom):
            ax.axvline(appeared, color="grey", linestyle=":", linewidth=1)
        bottom.annotate(f"induction heads appear (step {appeared})", (appeared, 0.05),
                        xytext=(5, 0), textcoords="offset points", fontsize=8)
    bottom.legend(loc="center right", fontsize=8)
    return fig


def _nan_if_none(x: float | None) -> float:
    """A loss recorded as null (no such words in the validation data) is a gap in the curve."""
    return float("nan") if x is None else x
