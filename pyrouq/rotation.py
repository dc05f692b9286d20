"""Rotated images, a distribution shift: :func:`rotate` turns a batch of images, and
:func:`evaluate_rotations` measures accuracy, calibration and uncertainty of a model as the
angle grows (rotated MNIST, as in the uncertainty literature)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from pyrouq._images import Constants, as_nchw, normalisation
from pyrouq._meta_device import real_device
from pyrouq._numbers import (
    finite_float,
    finite_number,
    is_integer,
    is_one_number,
    one_number,
    shown,
)
from pyrouq._one_at_a_time import one_at_a_time
from pyrouq._tables import unsigned_zero
from pyrouq._util import check_flag, rng_state, set_rng_state
from pyrouq.uncertainty import Measure, decompose

__all__ = ["DEFAULT_ANGLES", "evaluate_rotations", "format_rotation_table", "rotate"]

# Exact (cos, sin) of the multiples of 90 degrees, so quarter turns move pixels exactly.
_QUARTER_TURNS = {0: (1.0, 0.0), 1: (0.0, 1.0), 2: (-1.0, 0.0), 3: (0.0, -1.0)}


def rotate(
    images: torch.Tensor,
    angle: float,
    *,
    normalized: bool = True,
    mean: Constants = None,
    std: Constants = None,
) -> torch.Tensor:
    """Rotate a batch of images by ``angle`` degrees counter-clockwise about their centre.

    Bilinear interpolation (``torch.nn.functional.grid_sample``, ``align_corners=False``, the
    same sampling as ``torchvision.transforms.functional.rotate`` with bilinear interpolation);
    pure torch, on the device and in the dtype of ``images`` (float16 and bfloat16 are sampled
    in float32, then rounded). Every channel of an RGB image is rotated alike, exactly as each
    would be alone. Pixels rotated in from outside the image are black in *raw* pixel space: 0
    for raw ``[0, 1]`` images (``normalized=False``), ``(0 - mean) / std`` per channel for
    images normalised as ``(x - mean) / std`` (``normalized=True``): by default, for one
    channel, ``(0 - 0.1307) / 0.3081 ≈ -0.4242`` (:data:`~pyrouq.data.NORMALIZED_BLACK`), as
    :func:`load_mnist` normalises. Since the normalisation is affine, rotating normalised
    images this way equals normalising the rotated raw images. A multiple of 360 returns an
    unchanged copy, and a multiple of 90 of a square image is an exact permutation of the
    pixels (``torch.rot90``).

    Parameters
    ----------
    images : torch.Tensor
        Floating-point grey ``(N, 1, H, W)``, ``(N, H, W)`` or flattened ``(N, H * H)``
        (square) images, e.g. ``(N, 1, 28, 28)`` or ``(N, 784)`` MNIST batches, or RGB
        ``(N, 3, H, W)`` images, e.g. CIFAR's ``(N, 3, 32, 32)``. Other channel counts are
        refused.
    angle : float
        Degrees, counter-clockwise; any finite real number (an int is reduced modulo 360
        exactly, however large).
    normalized : bool, default True
        Whether ``images`` are normalised as ``(x - mean) / std`` (which decides the
        background value, see above) or raw ``[0, 1]`` images (False).
    mean, std : float or sequence of float, optional
        The normalisation of ``images``: one value per channel (a sequence, or a tensor or
        array of shape ``(C,)`` or one that broadcasts, ``(1, C, 1, 1)``), or one number for
        every channel (a one-element tensor too), e.g.
        ``mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616)`` for CIFAR-10; only
        with ``normalized=True``. Default: MNIST's ``0.1307`` and ``0.3081`` for one-channel
        images; normalised RGB images need them (a ValueError says so).

    Returns
    -------
    torch.Tensor
        The rotated images, of the shape, dtype and device of ``images``.

    Examples
    --------
    >>> x = torch.zeros(1, 1, 3, 3)
    >>> x[0, 0, 0, 1] = 1.0  # top centre
    >>> rotate(x, 90, normalized=False)[0, 0]  # now middle left
    tensor([[0., 0., 0.],
            [1., 0., 0.],
            [0., 0., 0.]])
    >>> rotate(torch.zeros(2, 784), 45).shape
    torch.Size([2, 784])
    >>> rgb = torch.zeros(1, 3, 2, 2)  # black, normalised per channel
    >>> rotate(rgb - 1, 45, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)).unique()
    tensor([-1.])
    """
    angle = _turn(angle)
    normalized = check_flag("normalized", normalized)  # "no" or None: no background guessed
    x = _image_batch(images)
    norm = normalisation(normalized, mean, std, x.shape[1])
    shape = images.shape
    if angle % 360 == 0 or images.numel() == 0:
        return images.clone()
    height, width = x.shape[-2:]
    if angle % 90 == 0 and height == width:  # a permutation of the pixels: exact
        return torch.rot90(x, int(angle % 360) // 90, dims=(-2, -1)).reshape(shape)
    if angle % 90 == 0:
        cos, sin = _QUARTER_TURNS[int(angle % 360) // 90]
    else:
        radians = math.radians(angle % 360)  # exact remainder: a huge angle keeps its turn
        cos, sin = math.cos(radians), math.sin(radians)
    # affine_grid maps each output location to the input location it samples, in coordinates
    # normalised to [-1, 1] per axis (y pointing down): a counter-clockwise turn on screen
    # samples the input at R(angle) @ (x, y), rescaled for non-square images.
    # float16 / bfloat16 sample in float32: in their precision the grid misplaces pixels by up
    # to a tenth of a pixel (errors of 0.07 / 0.47 on MNIST, 70 times their rounding)
    work = x.float() if torch.finfo(x.dtype).bits < 32 else x
    theta = torch.tensor(
        [[[cos, -sin * height / width, 0.0], [sin * width / height, cos, 0.0]]],
        dtype=work.dtype,
        device=x.device,
    )
    grid = torch.nn.functional.affine_grid(
        theta, [1, 1, height, width], align_corners=False
    ).expand(x.shape[0], -1, -1, -1)
    blacks = [0.0] if norm is None else [(0.0 - m) / s for m, s in zip(*norm, strict=True)]
    background: float | Tensor = blacks[0]  # as a number for one channel, as it always was
    if len(blacks) > 1:  # the same value in the same dtype as a one-channel image gets
        background = torch.tensor(blacks, dtype=work.dtype, device=x.device).view(1, -1, 1, 1)
    out = torch.nn.functional.grid_sample(
        work - background, grid, mode="bilinear", padding_mode="zeros", align_corners=False
    )
    return (out + background).to(x.dtype).reshape(shape)


def _image_batch(images: object) -> Tensor:
    """``images`` as ``(N, C, H, W)`` with C = 1 or 3 (a view), or a TypeError / ValueError
    saying what to pass."""
    if not isinstance(images, torch.Tensor):
        raise TypeError(
            f"Expected images to be a torch.Tensor, got {type(images).__name__}; wrap them "
            "with torch.as_tensor(...)."
        )
    if not images.is_floating_point():
        raise TypeError(
            f"Expected floating-point images, got dtype {images.dtype}; for raw uint8 pixels "
            "pass images.float() / 255 with normalized=False."
        )
    return as_nchw(images)


def _turn(angle: object) -> float:
    """``angle`` as a float of degrees, an int reduced modulo 360 exactly first (its float
    alone drops the turn past 2**53: 360 * 10**20 + 90 was a whole number of turns, and
    10**400 none at all), or :func:`_check_angle`'s refusal."""
    if is_integer(angle):
        return float(int(angle) % 360)
    return _check_angle(angle)


def _check_angle(angle: object, name: str = "angle") -> float:
    """``angle`` as a finite float, or a TypeError / ValueError naming ``name``."""
    if isinstance(angle, bool) or not isinstance(angle, numbers.Real):
        fix = f"{name}=30 or {name}=float(t)"
        if not name.isidentifier():  # "each angle" of evaluate_rotations' angles
            fix = "angles=[0, 30] or angles=[float(a) for a in angles]"
        raise TypeError(
            f"Expected {name} to be a real number of degrees (int or float), got "
            f"{type(angle).__name__} {angle!r}; pass e.g. {fix}."
        )
    value = finite_float(angle)  # (None: NaN, inf, and 10**400, which float() refuses)
    if value is None and is_integer(angle):  # finite, past a float's range
        raise ValueError(
            f"Expected {name} to be a number of degrees a float can hold (up to about "
            f"1.8e308), got {shown(angle)}, an int past that range; reduce it with % 360, "
            "which gives the same turn."
        )
    if value is None:
        raise ValueError(f"Expected {name} to be a finite number of degrees, got {shown(angle)}.")
    return value


# --------------------------------------------------------------------------------------------
# Predictions on rotated inputs
# --------------------------------------------------------------------------------------------

DEFAULT_ANGLES: tuple[int, ...] = tuple(range(0, 181, 15))
"""Angles (degrees) of :func:`evaluate_rotations`: 0, 15, ..., 180."""

_ROTATION_KEYS = ("angle", "acc", "ece", "epistemic", "total")


@one_at_a_time
@torch.no_grad()
def evaluate_rotations(
    model: nn.Module | Any,
    x: Tensor,
    y: Tensor,
    guide: Any = None,
    *,
    angles: Iterable[float] = DEFAULT_ANGLES,
    num_samples: int | None = None,
    batch_size: int = 1024,
    measure: Measure = "entropy",
    normalized: bool = True,
    mean: Constants = None,
    std: Constants = None,
    progress: bool = True,
    seed: int | None = None,
    posterior_samples: Any = None,
) -> list[dict[str, float]]:
    """Accuracy, calibration and uncertainty of a model on rotated copies of ``x``.

    For each angle, ``x`` is rotated with :func:`rotate` and passed to
    :func:`predict`; the metrics are those of :mod:`pyrouq.metrics` on the mean predictive
    probabilities, so the row at angle 0 agrees with :func:`pyrouq.metrics.evaluate`.

    Every angle sees the same S posterior draws (common random numbers): the torch RNG state
    is saved before the first angle and restored before each other one, so the rows differ by
    the rotation alone, not by Monte Carlo noise. Afterwards the RNG has advanced as after one
    :func:`predict` call.

    Parameters
    ----------
    model, guide, num_samples, batch_size, posterior_samples
        As in :func:`predict`: a guide's draws, or draws from anywhere (an MCMC result, a
        ``{site: (S, ...)}`` dict) given by name, ``posterior_samples=``.
    x : torch.Tensor
        ``(N, 1, 28, 28)`` or ``(N, 784)`` images (any grey square images), or RGB
        ``(N, 3, H, W)`` images such as CIFAR's ``(N, 3, 32, 32)``; as :func:`rotate` takes
        them.
    y : torch.Tensor
        ``(N,)`` integer labels. The model is a classifier: a regression model (a
        ``Gaussian`` likelihood) is refused, with how to evaluate it
        (``predict(model, rotate(x, angle), guide).evaluate(y)``).
    angles : iterable of float, default ``(0, 15, ..., 180)``
        Rotation angles in degrees, counter-clockwise.
    measure : {"entropy", "variance", "zero_one"}, default "entropy"
        Uncertainty measure of the ``epistemic`` and ``total`` columns (see
        :func:`pyrouq.uncertainty.decompose`); with ``"entropy"`` they are the mutual
        information and the predictive entropy in nats.
    normalized, mean, std
        The normalisation of ``x``, which decides the background value that rotates in, as in
        :func:`rotate`: by default MNIST's for grey images; normalised RGB images need
        per-channel ``mean=`` and ``std=`` (or ``normalized=False`` for images in ``[0, 1]``).
    progress : bool, default True
        One tqdm bar over the angles, shown once the sweep has taken more than 2 s (the
        predictions themselves show none).
    seed : int, optional
        As in :func:`predict`: the sweep's draws come from torch's streams seeded with it
        (as ``pyro.set_rng_seed(seed)`` seeds them) inside a fork of the random state, so the
        rows repeat to the bit and the global streams are left as they were.

    Returns
    -------
    list of dict of str to float
        One row per angle, in the given order, with keys ``angle`` (degrees), ``acc``,
        ``ece`` (fractions, 15 equal-width bins), ``epistemic`` and ``total`` (means over the
        N inputs). Print them with :func:`format_rotation_table`, plot them with
        :func:`pyrouq.plotting.plot_rotation`.

    Examples
    --------
    >>> from pyrouq.models import MLP
    >>> rows = evaluate_rotations(MLP(), torch.randn(8, 1, 28, 28), torch.arange(8), angles=[0, 90])
    >>> [row["angle"] for row in rows], sorted(rows[0])
    ([0.0, 90.0], ['acc', 'angle', 'ece', 'epistemic', 'total'])
    """
    from pyrouq._metric_inputs import _check_targets, check_labels, label_shape_fix
    from pyrouq._seeded import draw_devices, seeded
    from pyrouq.metrics import _prepare_probs, acc, ece
    from pyrouq.predictive import class_predictions, predict  # (predictive imports nothing here)
    from pyrouq.uncertainty import _check_measure

    if seed is not None:  # the whole sweep in a seeded fork of torch's random state
        with seeded(seed, "evaluate_rotations()", draw_devices(model, guide, x)):
            return evaluate_rotations(
                model, x, y, guide, angles=angles, num_samples=num_samples,
                batch_size=batch_size, measure=measure, normalized=normalized, mean=mean,
                std=std, progress=progress, posterior_samples=posterior_samples,
            )  # fmt: skip

    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        bad = "x" if not isinstance(x, Tensor) else "y"
        raise TypeError(
            f"evaluate_rotations() expects x and y as tensors (images (N, ...) and labels "
            f"(N,)), got {bad} of type {type(x if bad == 'x' else y).__name__}; concatenate "
            "the batches of a loader with torch.cat first."
        )
    _refuse_regression(model)  # (before y's checks, which would ask for class labels)
    channels = _image_batch(x).shape[1]  # its layout first: y's shape is read against x's N
    if x.shape[0] == 0:  # (else predict()'s words, after the other checks)
        raise ValueError(
            f"evaluate_rotations() got no images: x is empty (shape {tuple(x.shape)}). Expected "
            "at least one image, x of shape (N, ...) with N >= 1: pass at least one image, "
            "with its label in y."
        )
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        n = x.shape[0]  # (N, k > 1) labels of the N images: one-hot rows (the classes unknown)
        c = y.shape[1] if y.dim() == 2 and y.shape[0] == n and y.shape[1] > 1 else -1
        fix = label_shape_fix(
            y.shape, n, c, "y", y.dtype, "pass the labels of exactly the images of x"
        )
        raise ValueError(
            f"Expected y of shape (N,) = ({n},), one label per image of x, got shape "
            f"{tuple(y.shape)}; {fix}."
        )
    check_labels(y, x.shape[0], None, "y")  # before any prediction (the classes: after one)
    _check_measure(measure)
    normalized = check_flag("normalized", normalized)
    normalisation(normalized, mean, std, channels)  # before any prediction
    progress = check_flag("progress", progress)
    angles = _check_angles(angles)
    if not angles:
        raise ValueError("Expected at least one angle, got none; pass e.g. angles=(0, 45, 90).")
    device = real_device("evaluate_rotations()", model, guide) or x.device
    rng = rng_state(device)
    rows = []
    for i, angle in enumerate(_angles_bar(angles) if progress else angles):
        if i:
            set_rng_state(device, rng)
        preds = predict(
            model,
            rotate(x, angle, normalized=normalized, mean=mean, std=std),  # an int: exact
            guide,
            num_samples=num_samples,
            batch_size=batch_size,
            posterior_samples=posterior_samples,
            progress=False,
        )
        probs = _prepare_probs(class_predictions(preds, "evaluate_rotations()").probs)
        if not i:  # y's upper bound, now that the classes are known, in words naming y
            _check_targets(y, probs[0], "y", "x")
        parts = decompose(probs, measure)
        rows.append(
            {
                "angle": float(angle),
                "acc": acc(probs, y),
                "ece": ece(probs, y),
                "epistemic": float(parts.epistemic.mean()),
                "total": float(parts.total.mean()),
            }
        )
    return rows


def _refuse_regression(model: Any) -> None:
    """Refuse a model of a ``Gaussian`` likelihood, a regression model: the sweep's metrics
    are of class probabilities, and its targets class labels. Any other likelihood passes (a
    ``Categorical`` of a module reloaded in a notebook is no instance of today's class)."""
    from pyrouq._wrappers import given_model, held_name
    from pyrouq.likelihoods import Gaussian, likelihood_of

    likelihood = likelihood_of(given_model(model))
    if not isinstance(likelihood, Gaussian):
        return
    raise TypeError(
        "evaluate_rotations() expects a classifier (its rows are accuracy and calibration of "
        f"class probabilities), got {held_name(model)} with a {type(likelihood).__name__} "
        "likelihood, a regression model, which it does not evaluate. Evaluate one with "
        "predict(model, x, guide).evaluate(y) (plot it with plot_regression() / "
        "plot_calibration()); under rotation, predict on rotate(x, angle) for each angle."
    )


def _check_angles(angles: Any) -> list[float | int]:
    """``angles`` as a list of finite floats (ints kept as ints, for :func:`rotate` to reduce
    exactly), or a TypeError saying what to pass instead (one number, a tensor or array of
    another rank, text: bytes iterated as numbers)."""
    ndim = getattr(angles, "ndim", None)  # a tensor's or an array's rank
    if ndim == 1 and hasattr(angles, "tolist"):
        angles = angles.tolist()
    elif ndim is not None or isinstance(angles, (str, bytes)) or not isinstance(angles, Iterable):
        if is_one_number(angles):
            fix = f"angles=[{one_number(angles):g}] for one angle"
        elif ndim:
            fix = "angles=angles.flatten()"
        else:
            fix = "angles=(0, 45, 90)"
        got = f"{type(angles).__name__} of shape {tuple(angles.shape)}" if ndim else repr(angles)
        raise TypeError(
            f"Expected angles to be an iterable of degrees, got {got}; pass e.g. {fix}, or "
            "angles=range(0, 181, 15)."
        )
    given = list(angles)
    checked = [_check_angle(a, "each angle") for a in given]  # (a row's angle is a float)
    return [int(a) if is_integer(a) else c for a, c in zip(given, checked, strict=True)]


def _angles_bar(angles: list[float | int]) -> Any:
    """The angles, iterated under a tqdm bar that shows itself only after 2 s."""
    from pyrouq._progress import tqdm

    return tqdm(angles, desc="rotations", unit="angle", leave=False, delay=2.0)


def format_rotation_table(rows: Iterable[dict[str, float]]) -> str:
    """Format the rows of :func:`evaluate_rotations` as one fixed-width text table.

    Accuracy and ECE are shown as percentages, the uncertainties with 5 decimals, in the box
    style of :func:`pyrouq.metrics.format_table`. Rows missing a key, holding a value that
    is not a finite number, or an ``acc`` or ``ece`` outside [0, 1] (they are fractions), are
    refused.

    Examples
    --------
    >>> print(format_rotation_table([
    ...     {"angle": 0.0, "acc": 0.9912, "ece": 0.0041, "epistemic": 0.0123, "total": 0.0456},
    ...     {"angle": 90.0, "acc": 0.1534, "ece": 0.4012, "epistemic": 0.3012, "total": 1.2345},
    ... ]))
    ┌───────┬────────┬────────┬───────────┬─────────┐
    │ Angle │    Acc │    ECE │ Epistemic │   Total │
    ├───────┼────────┼────────┼───────────┼─────────┤
    │    0° │ 99.12% │  0.41% │   0.01230 │ 0.04560 │
    │   90° │ 15.34% │ 40.12% │   0.30120 │ 1.23450 │
    └───────┴────────┴────────┴───────────┴─────────┘
    """
    rows = _check_rotation_rows(rows)
    header = ["Angle", "Acc", "ECE", "Epistemic", "Total"]
    body = [
        [
            unsigned_zero(row["angle"], "g") + "°",
            *(unsigned_zero(row[key], ".2%") for key in ("acc", "ece")),
            *(unsigned_zero(row[key], ".5f") for key in ("epistemic", "total")),
        ]
        for row in rows
    ]
    widths = [max(len(line[j]) for line in [header, *body]) for j in range(len(header))]
    bars = ["─" * (w + 2) for w in widths]

    def line(cells: list[str]) -> str:
        return "│ " + " │ ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " │"

    out = ["┌" + "┬".join(bars) + "┐", line(header), "├" + "┼".join(bars) + "┤"]
    out += [line(cells) for cells in body]
    out.append("└" + "┴".join(bars) + "┘")
    return "\n".join(out)


def _check_rotation_rows(rows: object) -> list[dict[str, float]]:
    """The rows of :func:`evaluate_rotations` as a list, or a TypeError / ValueError."""
    if isinstance(rows, (str, bytes, dict)) or not isinstance(rows, Iterable):
        raise TypeError(
            f"Expected rows to be a list of dicts (the output of evaluate_rotations()), got "
            f"{type(rows).__name__}."
        )
    out = list(rows)
    if not out:
        raise ValueError("Expected at least one row, got none; pass evaluate_rotations(...).")
    for row in out:
        missing = [k for k in _ROTATION_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError(
                f"A rotation row lacks the key(s) {missing}; expected dicts with keys "
                f"{list(_ROTATION_KEYS)}, as evaluate_rotations() returns them."
            )
        odd = {k: row[k] for k in _ROTATION_KEYS if not is_one_number(row[k])}
        if odd:
            raise TypeError(
                f"A rotation row holds non-numbers {odd}; expected a number for each of "
                f"{list(_ROTATION_KEYS)}, as evaluate_rotations() returns them."
            )
    # one-number tensors and arrays (a metric left as one) as floats, as the rows are read
    read = []
    for given in out:
        numbers = {k: finite_number(given[k]) for k in _ROTATION_KEYS}
        bad = [f"{k}={shown(given[k])}" for k, number in numbers.items() if number is None]
        huge = [k for k, number in numbers.items() if number is None and is_integer(given[k])]
        what = "NaN or infinite values"
        if huge:  # 10**400: finite, but no float holds it
            what = (
                "values past a float's range"
                if len(huge) == len(bad)
                else ("values that are NaN, infinite or past a float's range")
            )
        if bad:  # (plotted, an inf angle failed inside matplotlib, a figure left open)
            raise ValueError(
                f"A rotation row holds {what} ({', '.join(bad)}); expected "
                f"finite numbers for each of {list(_ROTATION_KEYS)}, as evaluate_rotations() "
                "returns them. Drop or repair that row."
            )
        row = {**given, **numbers}
        bad = [f"{k}={shown(given[k])}" for k in ("acc", "ece") if not 0 <= row[k] <= 1]
        if bad:  # (percentages given by hand: shown as "9800.00%")
            raise ValueError(
                f"A rotation row holds {', '.join(bad)} outside [0, 1]; expected acc and ece "
                "as fractions, as evaluate_rotations() returns them (they are shown as "
                "percentages). If they are percentages, divide them by 100."
            )
        read.append(row)
    return read
