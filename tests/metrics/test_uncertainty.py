"""Tests for pyrouq.uncertainty: hand-computed decompositions, identities, invariances, checks."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from pyrouq import metrics
from pyrouq.uncertainty import (
    Decomposition,
    _clamp_roundoff,
    decompose,
    entropy,
    expected_entropy,
    mutual_information,
)

MEASURES = ("entropy", "variance", "zero_one")
LN2 = math.log(2)


def dirichlet(s: int, n: int, c: int, dtype=torch.float64, concentration: float = 1.0):
    """(S, N, C) random probabilities."""
    alpha = torch.full((c,), concentration, dtype=torch.float64)
    return torch.distributions.Dirichlet(alpha).sample((s, n)).to(dtype)


def direct_total(probs: torch.Tensor, measure: str) -> torch.Tensor:
    """The textbook formula of the total part, on p̄."""
    mean = probs.mean(0)
    if measure == "entropy":
        return -torch.xlogy(mean, mean).sum(-1)
    if measure == "variance":
        return (mean * (1 - mean)).sum(-1)
    return 1 - mean.amax(-1)


# --- hand-computed values -------------------------------------------------------------------


def test_entropy_hand_computed():
    # input 0: two one-hot members that disagree -> p̄ = [.5, .5]: total ln 2, aleatoric 0.
    # input 1: two uniform members -> total ln 2, aleatoric ln 2, epistemic 0.
    probs = torch.tensor([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]], dtype=torch.float64)
    d = decompose(probs)
    torch.testing.assert_close(d.total, torch.tensor([LN2, LN2], dtype=torch.float64))
    torch.testing.assert_close(d.aleatoric, torch.tensor([0.0, LN2], dtype=torch.float64))
    torch.testing.assert_close(d.epistemic, torch.tensor([LN2, 0.0], dtype=torch.float64))


def test_entropy_hand_computed_bits_three_classes():
    # members [.5, .5, 0] and [0, 0, 1]: p̄ = [.25, .25, .5], H(p̄) = 1.5 bits;
    # H(p_1) = 1 bit, H(p_2) = 0 -> aleatoric 0.5 bits, epistemic 1.0 bit.
    probs = torch.tensor([[[0.5, 0.5, 0.0]], [[0.0, 0.0, 1.0]]], dtype=torch.float64)
    d = decompose(probs, "entropy", base=2)
    assert d.total.tolist() == pytest.approx([1.5], abs=1e-12)
    assert d.aleatoric.tolist() == pytest.approx([0.5], abs=1e-12)
    assert d.epistemic.tolist() == pytest.approx([1.0], abs=1e-12)


def test_variance_hand_computed():
    # members [.9, .1], [.1, .9]: p̄ = [.5, .5] -> total .5 * .5 * 2 = .5;
    # aleatoric = mean_s (.9 * .1 * 2) = .18; Var_s per class = (.4^2 + .4^2) / 2 = .16 -> .32.
    probs = torch.tensor([[[0.9, 0.1]], [[0.1, 0.9]]], dtype=torch.float64)
    d = decompose(probs, "variance")
    assert d.total.item() == pytest.approx(0.5, abs=1e-12)
    assert d.aleatoric.item() == pytest.approx(0.18, abs=1e-12)
    assert d.epistemic.item() == pytest.approx(0.32, abs=1e-12)


def test_zero_one_hand_computed():
    # members [.7, .2, .1], [.1, .3, .6]: p̄ = [.4, .25, .35] -> total 1 - .4 = .6;
    # aleatoric = mean(1 - .7, 1 - .6) = .35; epistemic = .25.
    probs = torch.tensor([[[0.7, 0.2, 0.1]], [[0.1, 0.3, 0.6]]], dtype=torch.float64)
    d = decompose(probs, "zero_one")
    assert d.total.item() == pytest.approx(0.6, abs=1e-12)
    assert d.aleatoric.item() == pytest.approx(0.35, abs=1e-12)
    assert d.epistemic.item() == pytest.approx(0.25, abs=1e-12)


def test_helpers_match_decompose_and_hand_values():
    probs = torch.tensor([[[0.5, 0.5]], [[1.0, 0.0]]], dtype=torch.float64)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert expected_entropy(probs).item() == pytest.approx(LN2 / 2, abs=1e-12)
    assert mutual_information(probs).item() == pytest.approx(h - LN2 / 2, abs=1e-12)
    assert mutual_information(probs, base=2).item() == pytest.approx((h - LN2 / 2) / LN2, abs=1e-12)
    assert entropy(torch.tensor([0.25, 0.25, 0.5]), base=2).item() == pytest.approx(1.5)
    # dim selects the class axis
    assert entropy(torch.tensor([[0.5, 1.0], [0.5, 0.0]]), dim=0, base=2).tolist() == [1.0, 0.0]


# --- identities and invariances -------------------------------------------------------------


@pytest.mark.parametrize("measure", MEASURES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("s", "c"), [(1, 2), (5, 3), (50, 10)])
def test_total_is_aleatoric_plus_epistemic(measure, dtype, s, c):
    probs = dirichlet(s, 40, c, dtype, concentration=0.5)
    d = decompose(probs, measure)
    for part in (d.total, d.aleatoric, d.epistemic):
        assert part.shape == (40,)
        assert part.dtype == dtype
        assert bool((part >= 0).all())
    torch.testing.assert_close(d.total, d.aleatoric + d.epistemic, atol=1e-6, rtol=0)
    # and total is the direct formula on p̄
    atol = 1e-12 if dtype == torch.float64 else 5e-6
    torch.testing.assert_close(d.total, direct_total(probs, measure), atol=atol, rtol=0)


@pytest.mark.parametrize("measure", MEASURES)
def test_epistemic_is_the_textbook_difference(measure):
    probs = dirichlet(8, 30, 4)
    d = decompose(probs, measure)
    if measure == "entropy":
        aleatoric = -torch.xlogy(probs, probs).sum(-1).mean(0)
    elif measure == "variance":
        aleatoric = (probs * (1 - probs)).sum(-1).mean(0)
    else:
        aleatoric = (1 - probs.amax(-1)).mean(0)
    torch.testing.assert_close(d.aleatoric, aleatoric)
    torch.testing.assert_close(d.epistemic, direct_total(probs, measure) - aleatoric)
    assert bool((d.epistemic > 1e-3).any())  # random members do disagree


@pytest.mark.parametrize("measure", MEASURES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_single_draw_has_zero_epistemic(measure, dtype):
    # exactly 0, not rounding: a plain network's OOD scores by mutual information must tie
    # (AUROC 0.5), not be ranked by round-off
    d = decompose(dirichlet(1, 25, 5, dtype), measure)
    logits = torch.randn(1, 500, 10, generator=torch.Generator().manual_seed(0)) * 4
    softmax = decompose(torch.softmax(logits.to(dtype), -1), measure)
    for one in (d, softmax):
        assert bool((one.epistemic == 0).all())
        assert bool((one.total == one.aleatoric).all())


@pytest.mark.parametrize("measure", MEASURES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_identical_members_have_zero_epistemic(measure, dtype):
    one = dirichlet(1, 25, 100, dtype, concentration=1.0)
    d = decompose(one.expand(30, -1, -1), measure)
    atol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(d.epistemic, torch.zeros_like(d.epistemic), atol=atol, rtol=0)
    assert bool((d.epistemic >= 0).all())  # round-off below 0 is clamped, never returned
    torch.testing.assert_close(d.total, decompose(one, measure).total, atol=atol * 10, rtol=0)


@pytest.mark.parametrize("measure", MEASURES)
def test_permuting_classes_changes_nothing(measure):
    probs = dirichlet(6, 20, 5)
    perm = torch.randperm(5)
    a, b = decompose(probs, measure), decompose(probs[..., perm], measure)
    for field in ("total", "aleatoric", "epistemic"):
        torch.testing.assert_close(getattr(a, field), getattr(b, field))


def test_permuting_draws_changes_nothing():
    probs = dirichlet(6, 20, 5)
    a, b = decompose(probs), decompose(probs[torch.randperm(6)])
    torch.testing.assert_close(a.epistemic, b.epistemic)


@pytest.mark.parametrize("base", [2, 10, 1.5])
def test_base_rescales_nats(base):
    probs = dirichlet(4, 10, 3)
    nats, other = decompose(probs), decompose(probs, base=base)
    for field in ("total", "aleatoric", "epistemic"):
        torch.testing.assert_close(getattr(other, field), getattr(nats, field) / math.log(base))


@pytest.mark.parametrize("measure", ["variance", "zero_one"])
def test_base_is_ignored_by_non_entropy_measures(measure):
    probs = dirichlet(4, 10, 3)
    torch.testing.assert_close(
        decompose(probs, measure, base=2).total, decompose(probs, measure).total
    )


def test_zero_log_zero_one_hot_has_zero_entropy():
    onehot = torch.eye(4, dtype=torch.float64)[torch.tensor([0, 3, 1])]  # (3, 4)
    probs = onehot.expand(2, -1, -1)
    d = decompose(probs)
    for part in (d.total, d.aleatoric, d.epistemic):
        assert not bool(part.isnan().any())
        assert part.tolist() == [0.0, 0.0, 0.0]
    assert entropy(onehot).tolist() == [0.0, 0.0, 0.0]
    assert str(entropy(onehot[0])) == "tensor(0., dtype=torch.float64)"  # no "-0."


def test_exact_zeros_in_some_members_only():
    # member 2 puts exactly 0 on class 0: still finite, and MI = ln 2 for disagreeing one-hots
    probs = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float32)
    d = decompose(probs)
    assert d.epistemic.item() == pytest.approx(LN2, abs=1e-6)
    assert torch.isfinite(d.total).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_entropy_split_in_place_is_the_one_with_gradients_to_the_bit(dtype):
    # without a gradient the logs are taken, and KL(p_s || mean) formed, in place (evaluate()
    # at N=2000, C=1000, S=16 peaked at 8.7x the float32 probabilities, now 6.2x): the same
    # bits as the graph's path, and the probabilities left as they came
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(6 * torch.randn(5, 40, 30, generator=g, dtype=dtype), -1)
    probs[0, :, 0] = 0.0  # exact zeros: log clamped, 0 log 0 = 0
    probs = probs / probs.sum(-1, keepdim=True)
    kept = probs.clone()
    plain = decompose(probs, "entropy", base=2)
    graph = decompose(probs.clone().requires_grad_(), "entropy", base=2)
    for part in ("total", "aleatoric", "epistemic"):
        assert torch.equal(getattr(plain, part), getattr(graph, part).detach()), part
    assert torch.equal(entropy(probs), entropy(probs.clone().requires_grad_()).detach())
    assert torch.equal(probs, kept)
    # the graph's path leaves what its gradients read: they are the formula's, written out
    leaf = torch.softmax(torch.randn(4, 3, 5, generator=g, dtype=dtype), -1).requires_grad_()
    split = decompose(leaf, "entropy")
    (split.aleatoric + 2 * split.epistemic).sum().backward()
    ref = leaf.detach().clone().requires_grad_()
    aleatoric = -(ref * ref.log()).sum(-1).mean(0)
    epistemic = (ref * (ref.log() - ref.mean(0).log())).sum(-1).mean(0)
    (aleatoric + 2 * epistemic).sum().backward()
    assert torch.allclose(leaf.grad, ref.grad, atol=1e-6)


def test_decomposition_is_frozen_and_documented():
    d = decompose(dirichlet(2, 3, 2))
    assert isinstance(d, Decomposition)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.total = d.aleatoric  # type: ignore[misc]
    assert "total = aleatoric + epistemic" in Decomposition.__doc__


def test_a_decomposition_of_many_inputs_has_a_short_repr():
    # a notebook cell ending in decompose(...) showed three whole tensors (1,125 characters at
    # N = 40, a screenful at 10,000 inputs); the repr gives N and each part's mean and range,
    # the attributes keep every value
    a = torch.linspace(0.5, 1.0, 40, dtype=torch.float64)
    probs = torch.stack([torch.stack([a, 1 - a], -1), torch.stack([1 - a, a], -1)])
    d = decompose(probs, "zero_one")
    assert repr(d) == (
        "Decomposition(N=40, total=<mean 0.5, 0.5 to 0.5>, aleatoric=<mean 0.25, 0 to 0.5>, "
        "epistemic=<mean 0.25, 0 to 0.5>)"
    )
    assert d.aleatoric.shape == (40,) and d.aleatoric[1].item() == pytest.approx(1 - a[1].item())
    few = decompose(torch.tensor([[[0.9, 0.1]] * 2, [[0.1, 0.9]] * 2]), "zero_one")
    assert repr(few) == (
        "Decomposition(total=[0.5, 0.5], aleatoric=[0.1, 0.1], epistemic=[0.4, 0.4])"
    )
    many = torch.ones(10_000, device="meta")  # (no values to show: not a failing repr)
    assert repr(Decomposition(many, many, many)) == (
        "Decomposition(N=10000, total=<meta>, aleatoric=<meta>, epistemic=<meta>)"
    )


def test_clamp_only_absorbs_roundoff():
    # private: an error above round-off cannot be produced through decompose(), whose epistemic
    # part is >= 0 mathematically; the public side (round-off clamped) is in
    # test_identical_members_have_zero_epistemic
    tiny = torch.tensor([-5e-7, 0.0, 0.3], dtype=torch.float64)
    assert _clamp_roundoff(tiny, "entropy").tolist() == [0.0, 0.0, 0.3]
    with pytest.raises(RuntimeError, match="not round-off"):
        _clamp_roundoff(torch.tensor([-1e-3]), "entropy")


# --- input checks -------------------------------------------------------------------------


def test_wrong_rank_message():
    with pytest.raises(
        ValueError, match=r"Expected probs of shape \(S, N, C\) \(3 dims\), got shape \(4, 10\)"
    ):
        decompose(torch.full((4, 10), 0.1))


def test_not_summing_to_one():
    probs = torch.full((2, 3, 4), 0.2)
    with pytest.raises(ValueError, match=r"sum to 1 .*tolerance 0\.001.*got sums between 0\.8"):
        decompose(probs)
    with pytest.raises(ValueError, match=r"torch\.softmax"):
        decompose(probs)


def test_small_normalisation_error_is_tolerated():
    probs = torch.full((2, 3, 4), 0.25) * (1 + 5e-4)
    assert decompose(probs).total.shape == (3,)


def test_negative_probabilities():
    probs = torch.tensor([[[1.5, -0.5]]])
    with pytest.raises(ValueError, match=r"non-negative.*minimum of -0\.5.*softmax"):
        decompose(probs)


def test_unknown_measure_lists_valid_ones():
    with pytest.raises(
        ValueError, match=r"Unknown measure 'bald'; expected one of 'entropy', 'variance', "
    ):
        decompose(dirichlet(2, 3, 2), "bald")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("base", "why"),
    [
        (0, r"a logarithm needs a positive base"),
        (-2.0, r"a logarithm needs a positive base"),
        (0.5, r"a base below 1 makes every uncertainty negative"),
        (1, r"log 1 is 0: every uncertainty would divide by it"),
        (1.0, r"log 1 is 0: every uncertainty would divide by it"),
        (float("nan"), r"NaN"),
        (float("inf"), r"an infinite base makes every uncertainty 0"),
        (True, r"a bool, not a real number"),
        ("2", r"a str, not a real number"),
    ],
)
def test_bad_base(base, why):
    with pytest.raises(ValueError, match=rf"base > 1, got .*\({why}\); use math\.e"):
        decompose(dirichlet(2, 3, 2), base=base)


def test_non_tensor_and_integer_dtype():
    with pytest.raises(TypeError, match=r"Expected probs to be a torch\.Tensor, got list"):
        decompose([[[1.0, 0.0]]])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"float32 or torch\.float64, got torch\.int64"):
        decompose(torch.tensor([[[1, 0]]]))


def test_nan_and_empty():
    probs = dirichlet(2, 3, 2)
    probs[0, 1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"finite probs, got 1 NaN or inf"):
        decompose(probs)
    with pytest.raises(ValueError, match=r"non-empty probs, got shape \(2, 0, 3\)"):
        decompose(torch.zeros(2, 0, 3))


def test_the_probs_checks_serve_the_metrics_and_name_their_argument():
    # the metrics take (N, C) mean probabilities too, and a refusal names the argument
    assert metrics.acc(torch.tensor([[0.25, 0.75], [0.9, 0.1]]), torch.tensor([1, 1])) == 0.5
    with pytest.raises(ValueError, match=r"Expected ood of shape \(S, N, C\) \(3 dims\) or "
                       r"\(N, C\) \(2 dims\), got shape \(2,\)\. Stack the draws/members on "
                       r"dim 0 and the classes on the last dim\.$"):  # fmt: skip
        metrics.evaluate(dirichlet(2, 3, 2), torch.tensor([0, 1, 0]), ood=torch.tensor([0.5, 0.5]))


def test_a_binary_classifiers_one_column_is_told_to_pass_both_classes():
    """A sigmoid's (N, 1) (or (N,)) probabilities of class 1 were told to apply a softmax or
    divide by the sums, which makes every entry 1; the labels 0 and 1 were then told to be
    relabelled as 0..0, and the metrics read every input right (acc 1, ECE 0)."""
    p = torch.tensor([0.2, 0.7, 0.9, 0.4])
    y = torch.tensor([0, 1, 1, 1])
    both = r"torch\.cat\(\[1 - p, p\], dim=-1\)"
    with pytest.raises(ValueError, match=rf"got one class \(shape \(4, 1\)\).*sigmoid.*{both}"):
        metrics.ece(p[:, None], y)
    with pytest.raises(ValueError, match=rf"logits z of class 1.*{both} with p = torch\.sigmoid"):
        metrics.nll(torch.logit(p)[:, None], y)  # (negative values: told of a softmax too)
    with pytest.raises(ValueError, match=rf"logits z of class 1.*{both} with p = torch\.sigmoid"):
        metrics.nll(torch.tensor([[0.5], [2.0], [3.0], [1.5]]), y)  # (none below 0, some above 1)
    with pytest.raises(ValueError, match=rf"got one class \(shape \(1, 4, 1\)\).*{both}"):
        decompose(p[None, :, None])
    with pytest.raises(ValueError, match=r"\(N,\) probabilities p of class 1 \(a sigmoid's\)\? "
                       r"Pass both classes, torch\.stack\(\[1 - p, p\], dim=-1\)\.$"):  # fmt: skip
        metrics.evaluate(p, y)
    ones = torch.ones(4, 1)  # (the softmax of that column): one class, certain everywhere
    with pytest.raises(ValueError, match=rf"probs hold one class, .*{both}.*keep these labels\.$"):
        metrics.acc(ones, y)
    assert metrics.acc(torch.stack([1 - p, p], dim=-1), y) == 0.75  # the fix told works
    assert metrics.acc(ones, torch.zeros(4, dtype=torch.long)) == 1.0  # one class: as before
    # labels -1 and 1 (a sigmoid's usual other coding) were told "relabel them as 0..0"
    signs = 2 * y - 1
    with pytest.raises(ValueError, match=rf"{both}.*relabel these as 0 and 1 \(e\.g\. "
                       r"\(targets > 0\)\.long\(\) for labels -1 and 1\)\.$"):  # fmt: skip
        metrics.acc(ones, signs)
    assert metrics.acc(torch.stack([1 - p, p], dim=-1), (signs > 0).long()) == 0.75


def test_one_column_with_labels_of_more_classes_is_not_told_to_keep_them():
    """Labels up to 4 beside one column of probabilities were told to pass a binary
    classifier's two columns and keep these labels, which then failed again (relabel them
    as 0..1): they name five classes, and the probabilities must cover them."""
    ones, y = torch.ones(5, 1), torch.tensor([0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"targets name classes up to 4\. Pass probabilities "
                       r"over every class, one column per class") as err:  # fmt: skip
        metrics.acc(ones, y)
    assert "keep these labels" not in str(err.value) and "cat([1 - p" not in str(err.value)
    with pytest.raises(ValueError, match=r"up to 2\. .*, and relabel the labels as 0\.\.C-1\.$"):
        metrics.acc(ones, torch.tensor([-1, 0, 2, 1, 0]))
    assert metrics.acc(torch.eye(5), y) == 1.0  # the fix told works


# --- module hygiene -----------------------------------------------------------------------


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("module", ["uncertainty.py", "metrics.py"])
def test_pure_torch_modules(module):
    names = imported_modules(Path(__file__).resolve().parents[2] / "pyrouq" / module)
    assert "torch" in names
    forbidden = ("pyro", "arviz", "matplotlib", "pyrouq.models")
    assert not [n for n in names if n.split(".")[0] in forbidden or n in forbidden]
