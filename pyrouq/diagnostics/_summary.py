"""``summary``: arviz's table of each variable of an export, with the diagnostics columns only
where the draws are Markov chains'."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyrouq._numbers import (
    finite_float,
    is_one_number,
    is_real,
    one_number,
    shown,
    tensor_hint,
    text_hint,
)
from pyrouq.diagnostics._common import ENSEMBLE_MEMBERS, GUIDE_DRAWS, _arviz, check_var_names_kind
from pyrouq.diagnostics._summary_options import check_summary_options

if TYPE_CHECKING:
    import arviz
    import pandas


def summary(
    idata: arviz.InferenceData,
    var_names: str | Sequence[str] | None = None,
    *,
    group: str = "posterior",
    hdi_prob: float | None = None,
    **kwargs: Any,
) -> pandas.DataFrame:
    """``az.summary`` of each variable: mean, sd and HDI, and for MCMC draws R-hat and ESS.

    For the draws of a guide or the members of an ensemble (what :func:`to_inference_data`
    records in the ``draws`` attribute) it is ``kind="stats"``: the diagnostics columns
    (R-hat, bulk and tail ESS, MCSE) measure the mixing of Markov chains, and those draws are
    independent, so they would tell nothing. For MCMC chains (and an ``idata`` from elsewhere)
    it is ``az.summary``'s default, ``kind="all"``, diagnostics included; ``kind`` may be
    passed then.

    Parameters
    ----------
    idata : arviz.InferenceData
        E.g. from :func:`to_inference_data`.
    var_names : str or sequence of str, optional
        Variables to summarise (default all; one row per scalar, so a whole network gives
        one row per weight).
    group : str, default "posterior"
        Group to summarise; an ensemble export has no posterior, use
        ``"posterior_predictive"`` there.
    hdi_prob : float, optional
        Probability mass of the HDI, in (0, 1) (arviz's default, 0.94, when None).
    **kwargs
        Passed on to ``az.summary`` (``round_to``, ``coords``, ...; ``kind`` for MCMC draws).
        A name ``az.summary`` takes no argument of (by its signature) is refused, as is
        ``data`` (``idata`` is passed as it).

    Returns
    -------
    pandas.DataFrame
        One row per scalar; columns ``mean``, ``sd``, ``hdi_3%``, ``hdi_97%`` (for 0.94), then
        for MCMC draws ``mcse_mean``, ``mcse_sd``, ``ess_bulk``, ``ess_tail`` and ``r_hat``.

    Examples
    --------
    >>> import pyro, torch
    >>> from pyrouq import BayesianMLP, mean_field_guide, to_inference_data
    >>> pyro.set_rng_seed(0)
    >>> x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    >>> idata = to_inference_data(model, mean_field_guide(model), x, y, num_samples=20)
    >>> table = summary(idata, "fc2.bias")  # guide draws: no R-hat, no ESS
    >>> list(table.index), list(table.columns)
    (['fc2.bias[0]', 'fc2.bias[1]', 'fc2.bias[2]'], ['mean', 'sd', 'hdi_3%', 'hdi_97%'])
    """
    az = _arviz()
    if not isinstance(idata, az.InferenceData):
        how = "(result)" if type(idata).__name__ == "MCMCResult" else "(model, guide, x, y)"
        raise TypeError(
            f"Expected idata to be an arviz.InferenceData, got {type(idata).__name__}; make "
            f"one with to_inference_data{how}."
        )
    check_summary_options(kwargs, az.summary)
    groups = idata.groups()
    draws = str(idata[groups[0]].attrs.get("draws", "")) if groups else ""
    independent = draws in (GUIDE_DRAWS, ENSEMBLE_MEMBERS)
    if independent and kwargs.get("kind", "stats") != "stats":
        raise TypeError(
            f"summary() of {draws} always uses kind='stats', got kind={kwargs['kind']!r}: R-hat "
            "and ESS mean nothing for independent draws. Call az.summary directly for other "
            "kinds."
        )
    if independent:
        kwargs["kind"] = "stats"
    check_var_names_kind(var_names, "summary()")
    if hdi_prob is not None:  # (a tensor or array of one number too: torch.tensor(0.9))
        one = is_one_number(hdi_prob) and not is_real(hdi_prob)
        p = one_number(hdi_prob) if one else finite_float(hdi_prob)
        if p is None or not 0 < p < 1:
            raise ValueError(  # (arviz's, for True and 1: "Too few elements for interval ...")
                f"summary(): expected hdi_prob in (0, 1), the HDI's probability mass, got "
                f"{shown(hdi_prob)}{'' if one else tensor_hint(hdi_prob)}"
                f"{text_hint(hdi_prob, 'hdi_prob', 0, 1)}. Pass e.g. "
                "hdi_prob=0.9, or None for arviz's 0.94."
            )
        hdi_prob = p
    if group not in groups:
        fix = (
            "A BatchEnsemble export has no posterior: pass group='posterior_predictive'."
            if group == "posterior" and draws == ENSEMBLE_MEMBERS
            else "Pass one of them as group=."
        )
        raise ValueError(f"idata has no {group!r} group; it has {groups}. {fix}")
    names = [var_names] if isinstance(var_names, str) else list(var_names or [])
    known = list(idata[group].data_vars)
    holds = f"{known[:10]}{' ...' if len(known) > 10 else ''}"
    if not {"chain", "draw"} <= set(idata[group].dims):
        raise ValueError(
            f"summary(): idata's {group!r} group holds no draws (its dims are "
            f"{list(idata[group].dims)}, no 'chain' and 'draw'): summarise a group of draws, "
            f"one of {[g for g in groups if {'chain', 'draw'} <= set(idata[g].dims)]}."
        )
    if var_names is not None and not names:
        raise ValueError(
            f"summary(): var_names is empty, so there is nothing to summarise: idata's "
            f"{group!r} group holds {holds}. Pick some of those, or var_names=None for all."
        )
    missing = [n for n in names if n not in known and not n.startswith("~")]
    if missing and kwargs.get("filter_vars") is None:  # else names are patterns
        raise ValueError(
            f"summary(): var_names {missing} are not in idata's {group!r} group, which holds "
            f"{holds}. Pick from those."
        )
    # a list: arviz read a tuple as one name (xarray's KeyError)
    return az.summary(idata, var_names=names or None, group=group, hdi_prob=hdi_prob, **kwargs)
