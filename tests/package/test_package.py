from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyrouq
from pyrouq.cli import main


def test_public_names_resolve():
    for name in pyrouq.__all__:
        assert getattr(pyrouq, name) is not None, name


def test_tab_completion_on_pyrouq_offers_its_public_names_and_subpackages_only():
    """dir(pyrouq), which a notebook's tab completion lists, held ``annotations`` (the
    ``__future__`` feature its __init__ imported, annotating nothing) beside the public names."""
    import types

    shown = {name for name in dir(pyrouq) if not name.startswith("_")}
    others = {n for n in shown if not isinstance(getattr(pyrouq, n), types.ModuleType)}
    assert others == set(pyrouq.__all__) - {"__version__"}


def test_import_does_not_load_arviz_or_matplotlib():
    code = (
        "import sys, pyrouq; print(sorted(m for m in ('arviz', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_version_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"pyrouq {pyrouq.__version__}"


def test_data_command_prints_summary(capsys):
    assert main(["data"]) == 0
    out = capsys.readouterr().out
    assert "MNIST: train 60000 / test 10000 images" in out
    assert "mean raw pixel 33.318/255" in out


def test_console_script_flushes_runs_atexit_and_returns_the_exit_code(tmp_path):
    # the console entry ends the process with os._exit: what main printed (to a pipe, so
    # block-buffered) and what atexit handlers print must still come out, with main's code
    code = (
        "import atexit, sys; atexit.register(lambda: print('atexit ran')); "
        "from pyrouq.cli import console; console()"
    )
    ok = subprocess.run(
        [sys.executable, "-c", code, "data"], capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert "MNIST: train 60000 / test 10000 images" in ok.stdout
    assert ok.stdout.rstrip().endswith("atexit ran")
    bad = subprocess.run(
        [sys.executable, "-m", "pyrouq", "data", "--data-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("pyrouq: error: MNIST train file not found")


def test_import_fit_predict_and_load_on_a_torch_without_the_names_torch_2_2_lacks(tmp_path):
    """pyproject allows torch 2.2, which has no torch.OutOfMemoryError (from 2.4; torch.cuda's
    is the same class), get_autocast_dtype (2.4), uint16/32/64 (2.3), get_default_device
    (2.3), compiler.is_compiling (2.3), nn.RMSNorm (2.4) nor AcceleratorError (2.8), and
    whose is_autocast_enabled takes no device (2.4): `import pyrouq` raised AttributeError
    on torch.OutOfMemoryError. Checked against torch 2.2's own stubs (torch/_C/__init__.pyi)."""
    code = (
        "import torch\n"
        "from torch import nn\n"
        "for name in ('OutOfMemoryError', 'AcceleratorError', 'get_default_device'):\n"
        "    if hasattr(torch, name): delattr(torch, name)\n"
        "if hasattr(nn, 'RMSNorm'): delattr(nn, 'RMSNorm')\n"
        "kept = {n: getattr(torch, n) for n in ('uint16', 'uint32', 'uint64')}\n"
        "compiling = torch.compiler.is_compiling\n"
        "for name in kept: delattr(torch, name)  # (torch's own code reads these: gone at import)\n"
        "del torch.compiler.is_compiling\n"
        "import pyrouq\n"
        "torch.compiler.is_compiling = compiling\n"
        "for name, kind in kept.items(): setattr(torch, name, kind)\n"
        "x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))\n"
        "y = (x[:, 0] > 0).long()\n"
        "model = pyrouq.BayesianMLP(4, 8, 2)\n"
        "guide = pyrouq.mean_field_guide(model)\n"
        "pyrouq.fit(model, guide, [(x, y)], epochs=2, num_data=16, progress=False, seed=0)\n"
        "enabled, dtype = torch.is_autocast_enabled, torch.get_autocast_dtype\n"
        "with torch.autocast('cpu', dtype=torch.bfloat16):  # (torch's own enter and exit)\n"
        "    torch.is_autocast_enabled = lambda: enabled()  # torch 2.2's: no device argument\n"
        "    del torch.get_autocast_dtype\n"
        "    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=16, progress=False, seed=0)\n"
        "    torch.is_autocast_enabled, torch.get_autocast_dtype = enabled, dtype\n"
        f"path = pyrouq.save({str(tmp_path / 'c.pt')!r}, model, guide)\n"
        "back = pyrouq.load(path)\n"
        "a = pyrouq.predict(model, x, guide, num_samples=3, progress=False, seed=1).probs\n"
        "b = pyrouq.predict(back.model, x, back.guide, num_samples=3, progress=False, seed=1)\n"
        "print(torch.equal(a, b.probs), a.shape)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True torch.Size([3, 16, 2])"


# What pyrouq (or its tests: the dev extra) uses that a declared floor must have: (package,
# the use as written, the folder whose files hold it, the oldest version checked to have it,
# the pyproject list whose floor must have it). Checked against each package's own code:
# matplotlib 3.7.0 lacks both and 3.8.0 has both; tqdm 4.59.0 takes delay=; torch.func
# (functional_call) is torch 2.0's, torch.compiler torch 2.1's, forward pre-hooks with kwargs
# torch 2.0's; numpy's get_state(legacy=) is 1.17's.
_USED_SINCE = [
    ("matplotlib", ".get_suptitle()", "tests", "3.8", "dev"),
    ("matplotlib", ".ecdf(", "tests", "3.8", "dev"),
    ("tqdm", "leave=False, delay=2.0", "pyrouq", "4.59", "dependencies"),
    ("torch", "from torch.func import functional_call", "pyrouq", "2.0", "dependencies"),
    ("torch", "@torch.compiler.disable", "pyrouq", "2.1", "dependencies"),
    ("torch", "register_forward_pre_hook(weigh, with_kwargs=True)", "pyrouq", "2.0",
     "dependencies"),
    ("numpy", "np.random.get_state(legacy=True)", "pyrouq", "1.17", "dependencies"),
]  # fmt: skip


def _holding(root: Path, folder: str, use: str) -> list[str]:
    """The Python files under ``root / folder`` that hold ``use`` (this file aside)."""
    here = Path(__file__).resolve()
    return [
        str(path.relative_to(root))
        for path in sorted((root / folder).rglob("*.py"))
        if path.resolve() != here and use in path.read_text(encoding="utf-8")
    ]


def _floor(pyproject: str, section: str, package: str) -> tuple[int, ...] | None:
    """The ``>=`` version of ``package`` in pyproject's ``section`` list (None where absent)."""
    start = pyproject.index(f"\n{section} = [")
    block = pyproject[start : pyproject.index("\n]", start)]
    found = re.search(rf'^\s*"{re.escape(package)}\s*>=\s*([0-9.]+)', block, re.M)
    return tuple(int(n) for n in found.group(1).split(".")) if found else None


@pytest.mark.parametrize(("package", "use", "where", "since", "section"), _USED_SINCE)
def test_a_declared_floor_has_what_pyrouq_and_its_tests_use(package, use, where, since, section):
    """pyproject declared matplotlib>=3.7 for the dev install too, while tests/metrics read
    Figure.get_suptitle() and Axes.ecdf() (matplotlib 3.8): under matplotlib 3.7.0 tests
    failed with AttributeError. A floor (the dev extra's where the tests alone need more) must
    be at least the version in the table, while some file under its folder holds the use; a
    use of the tests' alone must stay out of pyrouq, whose floor is the lower one."""
    root = Path(__file__).resolve().parents[2]
    assert _holding(root, where, use), f"no file under {where}/ holds {use!r}: drop its row"
    if section == "dev":
        inside = _holding(root, "pyrouq", use)
        assert not inside, (
            f"{inside} use {use!r} ({package} {since}), which only the tests used: raise "
            f"{package}'s floor in pyproject's dependencies to {since} and make its row's "
            "folder pyrouq, section dependencies"
        )
    pyproject = (root / "pyproject.toml").read_text()
    floors = [_floor(pyproject, s, package) for s in {section, "dependencies"}]
    floor = max(f for f in floors if f is not None)
    assert floor >= tuple(int(n) for n in since.split(".")), (package, use, floor)
