"""How ``pyrouq evaluate --calibrate temperature`` tells the warnings of
:func:`pyrouq.temperature_scale`, which it fits on a seeded half of the test split: the
library's advice is in Python's words ("Check that val_targets are the labels of val_preds",
"Fit T on a validation split with errors"), which a command-line user cannot follow. The same
warnings (category, place: the command's call of it) name what the command's user can do:
the labels in --data-root, the factory's network, leaving --calibrate out."""

from __future__ import annotations

import os

from pyrouq._temperature_warnings import Advice

_LEAVE = "or leave --calibrate out (T = 1, no change)."


def _labels_advice(data_root: str | None) -> str:
    """At T = 20 (the predictions barely tell the labels apart): labels that are not the
    images' (a data folder of one's own), or a model that has not learned."""
    model = (
        "the run's model tells the classes apart no better than chance (its accuracy above): "
        "train it longer (pyrouq fit --epochs), "
    )
    if data_root is not None:
        where = f"--data-root {data_root!r}"
    elif os.environ.get("PYROUQ_DATA"):
        where = "$PYROUQ_DATA (or --data-root)"
    else:  # the bundled copy: its labels are its images'
        return "T" + model[1:] + _LEAVE
    return (
        f"Check that the test labels in {where} are those of its test images, in the same "
        "order (t10k-labels-idx1-ubyte beside t10k-images-idx3-ubyte); else " + model + _LEAVE
    )


def in_command_words(data_root: str | None, factory: str | None) -> Advice:
    """temperature_scale()'s warnings for the user of ``pyrouq evaluate``, whose test split
    came from ``data_root`` (None: $PYROUQ_DATA or the bundled copy) and whose run's model
    came from the factory ``factory`` (None: a model of pyrouq's own)."""
    if factory is not None:  # (pyrouq's own models return logits)
        softened = (
            f"The factory {factory!r} must return logits, which pyrouq turns into "
            "probabilities: a network returning probabilities (ending in nn.Softmax) or "
            "shrunken logits gives flatter predictions. T = {bound:g} multiplies their "
            "log-odds by {factor:g}: make the factory's network return logits and fit the run "
            "again, " + _LEAVE
        )
    else:
        softened = (
            "T = {bound:g} multiplies their log-odds by {factor:g}, which may sharpen new "
            "predictions too far: compare the NLL before and after below, " + _LEAVE
        )
    depends = "" if factory is None else f" (and that the network of {factory!r} uses its input)"
    return Advice(
        name="--calibrate temperature",
        labels=_labels_advice(data_root),
        all_right=(
            "T cannot be fitted on a half of the test split without errors: leave --calibrate "
            "out (T = 1, no change), or evaluate on a larger or harder test split "
            "(--data-root)."
        ),
        softened=softened,
        flat=(
            "(every draw is uniform over the classes, or the draws disagree so symmetrically "
            "that their mixture is uniform at every T): no temperature fits better than "
            "another, so T = 1 (no change) is used. The run's model does not tell the images "
            f"apart: check its accuracy above{depends} and train it again, " + _LEAVE
        ),
    )
