"""Self-review of the day's changes: what the review mended in behaviour."""

from __future__ import annotations

import pytest

from pyrouq.cli._build import CommandError
from pyrouq.cli._run_dir import _rewrite


def test_a_resume_that_cannot_record_its_new_values_says_what_to_resume_with(tmp_path):
    """The refusal ended mid-sentence ("or resume with the run's"): it names the values."""
    path = tmp_path / "gone" / "config.json"  # (its folder is missing: the write fails)
    with pytest.raises(CommandError, match=r"resume with the run's own num_samples, device \("):
        _rewrite(path, {"num_samples": 4}, ["num_samples", "device"])
    assert not any(tmp_path.rglob("*.tmp"))
