"""save() names the file of a write the disk refuses however small the checkpoint (its bytes
then meet the disk at the flush or close, not inside torch.save); an error raised "from None"
while a disk's error was being handled is not called the disk's; the missing-package hint
gives pip's name (Pillow for PIL)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _toy import tiny_mlp

import pyrouq
from pyrouq import mean_field_guide


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_small_checkpoint_past_a_file_size_limit_names_its_file(tmp_path):
    pytest.importorskip("resource")
    code = """
        import json, os, resource, signal
        import pyrouq
        from torch import nn
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        model = pyrouq.bayesian(nn.Linear(3, 2))
        guide = pyrouq.mean_field_guide(model)
        resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))
        try:
            pyrouq.save("small.pt", model, guide)
            print(json.dumps(None))
        except OSError as err:
            print(json.dumps([err.errno, err.filename, sorted(os.listdir("."))]))
    """
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [errno.EFBIG, "small.pt", []]


class _Hidden(torch.Tensor):
    """Pickling fails with a RuntimeError raised "from None" while a disk-full error of its own
    was being handled (not the checkpoint's write)."""

    def __reduce_ex__(self, protocol):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("_Hidden refuses pickling") from None


def test_an_error_raised_from_none_over_a_disk_error_is_its_own(tmp_path):
    model = tiny_mlp()
    model.register_buffer("extra", torch.zeros(2).as_subclass(_Hidden))
    with pytest.raises(RuntimeError, match="_Hidden refuses pickling"):
        pyrouq.save(tmp_path / "m.pt", model, mean_field_guide(model))


def test_the_missing_package_hint_gives_pips_name(tmp_path):
    code = """
        import sys
        sys.modules["PIL"] = None  # as if Pillow were not installed
        import torch
        import pyrouq
        from torch import nn
        model = pyrouq.bayesian(nn.Linear(3, 2))
        guide = pyrouq.mean_field_guide(model)
        x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
        pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=8, progress=False)
        try:
            pyrouq.to_inference_data(model, guide, x, y, num_samples=2)
        except ImportError as err:
            print(err)
    """
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.splitlines()[-1]
    assert line.startswith("pyrouq.diagnostics needs arviz: it imports PIL ("), line
    assert line.endswith("): pip install Pillow."), line
