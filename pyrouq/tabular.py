"""Tabular data: an in-memory loader of ``(x, y)`` tensors, a seeded
train/test split, and standardisation fitted on the training split only.

Kept small and explicit::

    train_x, train_y, test_x, test_y = train_test_split(x, y, test_fraction=0.2, seed=0)
    scaler = Standardizer.fit(train_x, train_y)
    loader = ArrayLoader(*scaler.transform(train_x, train_y), batch_size=64, seed=0)
    fit(model, guide, loader, epochs=...)
    preds = scaler.inverse(predict(model, scaler.transform_x(test_x), guide))  # original units
    preds.evaluate(test_y)
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from pyrouq._arguments import set_generator_state
from pyrouq._numbers import finite_float, shown, tensor_hint, text_hint
from pyrouq._util import MAX_SEED, ShardedOrder, check_flag, check_int, check_seed

__all__ = ["ArrayLoader", "Standardizer", "train_test_split"]


def _check_xy(
    x: object, y: object, where: str, integers: bool = True, same_device: bool = True
) -> tuple[Tensor, Tensor]:
    """``x`` and ``y`` as tensors of N rows each, real (or, with ``integers``, integer: token
    ids, class labels) and finite (and, with ``same_device``, on one device: their rows are
    picked by one index), or a clear error."""
    if same_device and isinstance(x, Tensor) and isinstance(y, Tensor) and x.device != y.device:
        raise ValueError(
            f"{where}: x is on {x.device} and y on {y.device}; their rows are picked by one "
            "index, so they must be on one device: pass y.to(x.device) (or keep both on the "
            "CPU; fit() and predict() move each batch to the model's device)."
        )
    for name, value in (("x", x), ("y", y)):
        if not isinstance(value, Tensor):
            raise TypeError(
                f"{where}: expected {name} to be a torch.Tensor, got {type(value).__name__}; "
                "wrap it with torch.as_tensor(...)."
            )
        integer = not value.is_floating_point() and not value.is_complex()
        if value.dtype == torch.bool or not (value.is_floating_point() or (integers and integer)):
            allowed = "floating-point or integer" if integers else "floating-point"
            fix = f"{name}.float()"
            if integers and name == "y" and value.dtype == torch.bool:  # labels, most likely
                fix = "y.float() for real-valued targets, y.long() for class labels"
            raise TypeError(
                f"{where}: expected {allowed} {name}, got dtype {value.dtype}; use {fix}."
            )
        if value.dim() == 0 or value.shape[0] == 0:
            raise ValueError(
                f"{where}: expected {name} with a leading dimension of N >= 1 rows, got shape "
                f"{tuple(value.shape)}."
            )
        _refuse_not_finite(where, name, value)
    assert isinstance(x, Tensor) and isinstance(y, Tensor)
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"{where}: x and y must hold the same number of rows, got {x.shape[0]} and "
            f"{y.shape[0]}; expected one row of y per row of x (y[i] the target of x[i]): "
            "pass the x and y of the same examples."
        )
    return x, y


def _refuse_not_finite(where: str, name: str, value: Tensor) -> None:
    """Refuse a floating ``value`` (N >= 1 rows) holding NaN or inf, naming its first rows."""
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        bad = (~torch.isfinite(value.reshape(value.shape[0], -1))).any(1).nonzero()
        raise ValueError(
            f"{where}: {name} holds NaN or inf; remove or repair those rows first: "
            f"{bad.shape[0]} of {value.shape[0]}, at rows "
            f"{str(bad[:5, 0].tolist())[:-1]}{', ...' if bad.shape[0] > 5 else ''}]."
        )


class _Dataset(torch.utils.data.Dataset):
    def __init__(self, x: Tensor, y: Tensor):
        self.tensors = (x, y)

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.tensors[0][index], self.tensors[1][index]


class ArrayLoader(ShardedOrder):
    """Minibatches ``(x, y)`` of in-memory tensors, reshuffled every epoch from a seeded
    generator (its state is saved in :func:`pyrouq.fit` checkpoints, so a resumed run sees the
    same batches).

    Parameters
    ----------
    x, y : torch.Tensor
        ``(N, ...)`` inputs and ``(N, ...)`` targets, real or integer (token ids, class
        labels; the model's likelihood checks the targets when it trains).
    batch_size : int, default 64
    shuffle : bool, default True
    seed : int, optional
        Seed of the shuffling generator (None: drawn from torch's global generator); kept as
        ``loader.seed``, the drawn one too, as :class:`~pyrouq.data.TensorLoader` keeps its.

    Examples
    --------
    >>> loader = ArrayLoader(torch.randn(10, 3), torch.randn(10), batch_size=4, seed=0)
    >>> [tuple(x.shape) for x, _ in loader]
    [(4, 3), (4, 3), (2, 3)]
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        batch_size: int = 64,
        *,
        shuffle: bool = True,
        seed: int | None = None,
    ):
        x, y = _check_xy(x, y, "ArrayLoader")
        self.batch_size = check_int("batch_size", batch_size, hint="Pass e.g. batch_size=64.")
        self.shuffle = check_flag("shuffle", shuffle)
        self.dataset = _Dataset(x, y)
        self._generator = torch.Generator()
        if seed is None:
            seed = int(torch.randint(0, MAX_SEED + 1, (), device="cpu").item())  # a seed= value
        else:
            seed = check_seed(seed, "ArrayLoader")
        self.seed = seed
        self._generator.manual_seed(seed)

    def __len__(self) -> int:
        return -(-self._local_size(len(self.dataset)) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        x, y = self.dataset.tensors
        order = self._order(x.shape[0], self.shuffle, self._generator)
        if order is None:
            order = torch.arange(x.shape[0], device="cpu")
        n, order = order.shape[0], order.to(x.device)  # one copy to the device per epoch
        for start in range(0, n, self.batch_size):
            index = order[start : start + self.batch_size]
            yield self._rows(x, index), self._rows(y, index)

    def get_rng_state(self) -> Tensor:
        """The shuffling generator's state (what a checkpoint stores)."""
        return self._generator.get_state()

    def set_rng_state(self, state: Tensor) -> None:
        """Restore the shuffling generator's state."""
        set_generator_state(self._generator, state, "ArrayLoader")

    def __repr__(self) -> str:
        return (
            f"ArrayLoader(num_examples={len(self.dataset)}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, seed={self.seed}, device={self.dataset.tensors[0].device})"
        )


def train_test_split(
    x: Tensor, y: Tensor, *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(train_x, train_y, test_x, test_y)``: a seeded random split of the rows.

    The test split holds ``round(N * test_fraction)`` rows, Python's rounding (a half goes to
    the even count: 10 rows at 0.25 hold out 2).

    Examples
    --------
    >>> tx, ty, vx, vy = train_test_split(torch.randn(10, 2), torch.randn(10), seed=0)
    >>> tx.shape[0], vx.shape[0]
    (8, 2)
    """
    x, y = _check_xy(x, y, "train_test_split()")
    seed = check_seed(seed, "train_test_split()")
    fraction = finite_float(test_fraction)  # (None: also 10**400, which float() refuses)
    if fraction is None or not 0.0 < fraction < 1.0:
        raise ValueError(
            f"Expected test_fraction in (0, 1), got {shown(test_fraction)}"
            f"{tensor_hint(test_fraction)}{text_hint(test_fraction, 'test_fraction', 0, 1)}; "
            "e.g. 0.2 holds out a fifth of the rows."
        )
    n = x.shape[0]
    n_test = round(n * fraction)
    if not 1 <= n_test < n:
        raise ValueError(
            f"test_fraction={test_fraction} of {n} row{'s' if n != 1 else ''} leaves {n_test} "
            f"test and {n - n_test} training rows; both need at least one. Pass more rows or "
            "another fraction."
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed), device="cpu")
    test, train = order[:n_test].to(x.device), order[n_test:].to(x.device)
    return x[train], y[train], x[test], y[test]


def _fitting(value: object, mean: Tensor, name: str, where: str) -> Tensor:
    """``value`` if its rows have the columns ``mean`` was fitted on, else a clear error."""
    if not isinstance(value, Tensor):
        raise TypeError(
            f"Standardizer.{where}(): expected {name} to be a torch.Tensor, got "
            f"{type(value).__name__}; wrap it with torch.as_tensor(...)."
        )
    if not value.is_floating_point():
        raise TypeError(
            f"Standardizer.{where}(): expected a floating-point tensor, got {value.dtype}; the "
            f"scaler was fitted on real values: pass {name}.float()."
        )
    if value.dim() == 0 or tuple(value.shape[1:]) != tuple(mean.shape):
        fix = ""  # a column (N, 1) where fit() saw (N,), or the other way round
        if value.dim() == 1 and tuple(mean.shape) == (1,):
            fix = f" Pass {name}.unsqueeze(-1)."
        elif tuple(value.shape[1:]) == (1,) and not mean.shape:
            fix = f" Pass {name}.squeeze(-1)."
        raise ValueError(
            f"Standardizer.{where}(): expected {name} of shape "
            f"{str(('N', *mean.shape)).replace(chr(39), '')} as in fit() (rows of the columns "
            f"it was fitted on), got shape {tuple(value.shape)}.{fix}"
        )
    if value.shape[0]:  # (fit() refuses them: they would come back NaN or inf in silence)
        _refuse_not_finite(f"Standardizer.{where}()", name, value)
    if not bool(torch.isfinite(mean).all()):  # a mean made by hand: every value would be NaN
        cols = (~torch.isfinite(mean)).nonzero().flatten().tolist() if mean.dim() else []
        raise ValueError(
            f"Standardizer.{where}(): the scaler's {name}_mean holds NaN or inf"
            f"{f' in column(s) {cols}' if cols else ''}, so every standardised value there would "
            f"be NaN or inf. Make the scaler with Standardizer.fit(x, y), or pass finite means."
        )
    return value


def _standardised(value: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """``(value - mean) / std`` in the widest of their dtypes, whatever their shapes (torch
    keeps ``value``'s float16 against 0-d statistics, of one column, and promotes it against
    statistics per column)."""
    dtype = torch.promote_types(torch.promote_types(value.dtype, mean.dtype), std.dtype)
    return (value.to(dtype) - mean.to(value.device, dtype)) / std.to(value.device, dtype)


def _column_stats(t: Tensor) -> tuple[Tensor, Tensor]:
    """Per-column mean and (unbiased) standard deviation of ``t``, in ``t``'s dtype, computed
    in float64; a constant column gets its value as the mean and std 1 exactly (in float32 the
    mean of N copies of 0.1 rounds off it, which would leave a std of ~1e-8 and send any other
    value to ~1e8). A spread that rounds to 0 in ``t``'s dtype (a float32 column of zeros
    and one 1e-45) also gets std 1, not 0, which would send the column to inf and NaN."""
    wide = t.double()
    mean, std = wide.mean(0), wide.std(0)
    constant = (t == t[0]).all(0)
    mean = torch.where(constant, wide[0], mean)
    std = torch.where(constant, torch.ones_like(std), std).to(t.dtype)
    return mean.to(t.dtype), torch.where(std == 0, torch.ones_like(std), std)


def _check_stats(**stats: object) -> None:
    """Refuse a :class:`Standardizer` made by hand whose statistics are not tensors of real
    numbers, or whose standard deviations are not all finite and > 0: transform() divides by
    them (a zero gave inf, None failed later in "'NoneType' object has no attribute 'to'")."""
    for name, value in stats.items():
        if not isinstance(value, Tensor) or value.dtype == torch.bool or value.is_complex():
            got = f"a {value.dtype} tensor" if isinstance(value, Tensor) else type(value).__name__
            raise TypeError(
                f"Standardizer: expected {name} to be a tensor of real numbers, one per column, "
                f"got {got}. Use Standardizer.fit(x, y), or pass torch.as_tensor(...)."
            )
        mean = stats.get(name.replace("_std", "_mean"))
        if name.endswith("std") and isinstance(mean, Tensor):  # one std per mean, or one for all
            rows = (1, *mean.shape)  # rows of the data: (x - mean) / std keeps their shape
            try:
                fits = torch.broadcast_shapes(rows, value.shape) == rows
            except RuntimeError:  # shapes that do not broadcast
                fits = False
            if not fits:
                raise ValueError(
                    f"Standardizer: expected {name} of the shape of {name[0]}_mean, "
                    f"{tuple(mean.shape)} (one standard deviation per column, or one value "
                    f"for all), got shape {tuple(value.shape)}. Use Standardizer.fit(x, y), "
                    "or pass the statistics of the same columns."
                )
        bad = value[~(value.isfinite() & (value > 0))] if name.endswith("std") else None
        if bad is not None and bad.numel():
            raise ValueError(
                f"Standardizer: expected {name} finite and > 0 in every column (standard "
                f"deviations to divide by), got {bad.numel()} of {value.numel()} value(s) that "
                f"are not, e.g. {bad.flatten()[0].item()!r}. Use Standardizer.fit(x, y), which "
                "gives a constant column std 1."
            )


class Standardizer:
    """Zero mean, unit standard deviation per input feature and per target, with the
    statistics of the training split only (:meth:`fit`); :meth:`inverse` brings predictions
    back to the targets' units.

    Attributes
    ----------
    x_mean, x_std, y_mean, y_std : torch.Tensor
        Per column; a constant column gets std 1 (it is only centred). Passed by hand, each
        must be a tensor, and each std finite, > 0 and of its mean's shape (or one value) (a
        ValueError otherwise); a mean that is not finite is refused by the transforms and
        :meth:`inverse`, which would return NaN or inf.

    Examples
    --------
    >>> x, y = torch.tensor([[0.0], [1.0], [2.0]]), torch.tensor([10.0, 12.0, 14.0])
    >>> scaler = Standardizer.fit(x, y)  # y: mean 12, std 2 (unbiased)
    >>> scaler.transform(x, y)[1]
    tensor([-1.,  0.,  1.])
    """

    def __init__(self, x_mean: Tensor, x_std: Tensor, y_mean: Tensor, y_std: Tensor):
        _check_stats(x_mean=x_mean, x_std=x_std, y_mean=y_mean, y_std=y_std)
        self.x_mean, self.x_std = x_mean, x_std
        self.y_mean, self.y_std = y_mean, y_std

    @classmethod
    def fit(cls, x: Tensor, y: Tensor) -> Standardizer:
        """The statistics of ``x`` and ``y`` (the training split), column by column."""
        x, y = _check_xy(x, y, "Standardizer.fit()", integers=False, same_device=False)
        if x.shape[0] < 2:
            raise ValueError(
                f"Standardizer.fit() needs at least 2 rows to measure a spread, got {x.shape[0]}; "
                "fit it on the training split (2 rows or more), or make one of statistics you "
                "know: Standardizer(x_mean, x_std, y_mean, y_std), a tensor each."
            )
        for name, value in (("x", x), ("y", y)):
            if value.numel() == 0:  # torch would warn of "degrees of freedom <= 0"
                raise ValueError(
                    f"Standardizer.fit(): {name} of shape {tuple(value.shape)} has no columns "
                    f"to standardise; pass {name} of shape (N, D) with D >= 1 (or (N,))."
                )

        stats = (*_column_stats(x), *_column_stats(y))
        for name, std in (("x", stats[1]), ("y", stats[3])):
            if not bool(std.isfinite().all()):  # every value would be standardised to 0
                cols = (~std.isfinite()).nonzero().flatten().tolist()
                raise ValueError(
                    f"Standardizer.fit(): the standard deviation of {name} overflows "
                    f"{std.dtype}{f' in column(s) {cols}' if std.dim() else ''}; pass "
                    f"{name}.double(), or rescale it first."
                )
        return cls(*stats)

    def transform_x(self, x: Tensor) -> Tensor:
        """Standardised inputs, in the wider of ``x``'s dtype and the statistics' (as
        :meth:`inverse`: float16 inputs of a scaler fitted on float32 come back float32). NaN or
        inf in ``x`` is refused, as :meth:`fit` refuses it."""
        x = _fitting(x, self.x_mean, "x", "transform_x")
        return _standardised(x, self.x_mean, self.x_std)

    def transform_y(self, y: Tensor) -> Tensor:
        """Standardised targets, in the wider of ``y``'s dtype and the statistics'. NaN or inf
        in ``y`` is refused, as :meth:`fit` refuses it."""
        y = _fitting(y, self.y_mean, "y", "transform_y")
        return _standardised(y, self.y_mean, self.y_std)

    def transform(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Standardised ``(x, y)``, the inputs and targets of the same examples (one row of
        ``y`` per row of ``x``)."""
        rows = [v.shape[0] for v in (x, y) if isinstance(v, Tensor) and v.dim()]
        if len(rows) == 2 and rows[0] != rows[1]:
            raise ValueError(
                f"Standardizer.transform(): x and y must hold the same number of rows, got "
                f"{rows[0]} and {rows[1]}; expected one row of y per row of x (y[i] the target "
                "of x[i]): pass the x and y of the same examples, or standardise them apart "
                "with transform_x() and transform_y()."
            )
        return self.transform_x(x), self.transform_y(y)

    def inverse(self, predictions: object) -> object:
        """:class:`~pyrouq.GaussianPredictions` of standardised targets, in the targets'
        original units (means, standard deviations and carried targets rescaled; in the
        statistics' dtype when it is wider: float64 targets give float64 predictions)."""
        rescale = getattr(predictions, "rescale", None)
        if not callable(rescale):
            fix = (
                "; for a tensor of standardised targets or means: t * scaler.y_std + scaler.y_mean"
                if torch.is_tensor(predictions)
                else ""
            )
            raise TypeError(
                f"Expected GaussianPredictions (what predict() returns for a Gaussian model), "
                f"got {type(predictions).__name__}{fix}."
            )
        fitted = max(1, self.y_mean.numel())
        outputs = getattr(predictions, "num_outputs", fitted)
        if outputs != fitted:
            raise ValueError(
                f"Standardizer.inverse(): the predictions have {outputs} output(s), the scaler "
                f"was fitted on targets of {fitted} column(s): it rescales the predictions of "
                "a model trained on the targets it was fitted on. Fit it on those targets."
            )
        return rescale(self.y_mean, self.y_std)

    def __repr__(self) -> str:
        return f"Standardizer(x: {tuple(self.x_mean.shape)}, y: {tuple(self.y_mean.shape)})"
