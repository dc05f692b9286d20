"""The temporary file save() writes a checkpoint to before renaming it into place: private
while it replaces a private checkpoint, and named so that any file name torch.save takes
(up to the file system's 255 bytes) can be saved to."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import Gaussian, bayesian


def _model():
    torch.manual_seed(0)
    return bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_save_keeps_a_private_checkpoint_private_while_it_replaces_it(tmp_path, monkeypatch):
    model = _model()
    before = os.umask(0o022)  # files are created 0o644: readable by everyone
    try:
        path = pyrouq.save(tmp_path / "private.pt", model)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
        os.chmod(path, 0o600)
        seen = []  # the modes of the files in the folder while the checkpoint is written
        real_save = torch.save

        def watching(obj, file, *args, **kwargs):
            seen.extend(
                (p.name == "private.pt", stat.S_IMODE(os.stat(p).st_mode))
                for p in tmp_path.iterdir()
            )
            return real_save(obj, file, *args, **kwargs)

        monkeypatch.setattr(torch, "save", watching)
        pyrouq.save(path, model)
        monkeypatch.undo()
        # the temporary file another user could have opened (and kept open) was 0o644
        assert sorted(seen) == [(False, 0o600), (True, 0o600)]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert [p.name for p in tmp_path.iterdir()] == ["private.pt"]
    finally:
        os.umask(before)


@pytest.mark.parametrize(
    "name",
    [
        "a" * 236 + ".pt",  # 239 bytes: 4 more than the temporary name then took (OSError 36)
        "b" * 252 + ".pt",  # 255 bytes, the most a file name may have here
        "é" * 125 + ".pt",  # 253 bytes of 128 characters
    ],
)
@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_save_takes_a_file_name_of_up_to_255_bytes(tmp_path, name):
    assert len(os.fsencode(name)) <= 255
    torch.save({}, tmp_path / name)  # a name torch.save itself takes
    (tmp_path / name).unlink()
    model = _model()
    path = pyrouq.save(tmp_path / name, model)
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left
    loaded = pyrouq.load(path, module=nn.Linear(2, 1)).model
    saved, kept = model.state_dict(), loaded.state_dict()
    assert sorted(kept) == sorted(saved)
    assert all(torch.equal(kept[k], saved[k]) for k in saved)
