"""Review of the eighth audit's ranks-settings and checkpoint changes.

1. fit() on ranks compares the models' descriptions, which name a network's class with its
   module. A script that runs rank 0 itself and spawns the other ranks (multiprocessing's
   "spawn": the children import the script as ``__mp_main__``) has the same class named
   ``__main__.Net`` on rank 0 and ``__mp_main__.Net`` on the others: the ranks, built alike,
   were refused as "models differ in their module" (they trained before).
2. A network compiled before converting: load()'s refusal of a plain skeleton (below).
3. fit(resume_from=) of an absent file from a loader that cannot tell N (below).
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from _processes import run_in_own_group
from torch import nn

from pyrouq import BayesianMLP, CheckpointError, bayesian, fit, load, mean_field_guide, save

_SCRIPT = """
import os, sys
import torch, torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
import pyrouq

class Net(nn.Module):  # defined in the script: __main__.Net here, __mp_main__.Net when spawned
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x):
        return self.fc(x)

def run(rank, init):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = pyrouq.bayesian(Net(), likelihood="gaussian")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, generator=g), torch.randn(16, 1, generator=g)
    loader = pyrouq.ArrayLoader(x, y, batch_size=4, seed=0)
    try:
        pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, epochs=1, progress=False,
                   seed=0)
        print(f"rank {rank}: trained", flush=True)
    except Exception as err:
        print(f"rank {rank}: {err}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)

if __name__ == "__main__":
    process = mp.get_context("spawn").Process(target=run, args=(1, sys.argv[1]))
    process.start()
    run(0, sys.argv[1])
"""


def test_a_script_running_rank_0_itself_beside_spawned_ranks_trains(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    done = run_in_own_group(
        [sys.executable, str(script), str(tmp_path / "init")], None, 120, merge_stderr=True
    )
    assert "rank 0: trained" in done.stdout, done.stdout[-2000:]
    assert "rank 1: trained" in done.stdout, done.stdout[-2000:]


# 2. bayesian(torch.compile(net)) ----------------------------------------------------------------
#
# A network compiled before it was converted stays wrapped inside the model (save() unwraps only
# the model it is given). load() into a plain skeleton was told the file was written "by an
# earlier pyrouq" and to "save the loaded model again", which writes the same file.


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_network_compiled_before_converting_is_told_to_convert_before_compiling(tmp_path):
    def net():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

    torch.manual_seed(0)
    path = save(tmp_path / "c.pt", bayesian(torch.compile(net(), backend="eager")))
    with pytest.raises(CheckpointError) as err:
        load(path, module=net())
    message = str(err.value)
    assert "earlier pyrouq" not in message and "save the loaded model again" not in message
    assert "holds a BayesianNetwork made from a Sequential compiled by torch.compile" in message
    assert "convert before compiling: torch.compile(bayesian(net))" in message
    load(path, module=torch.compile(net(), backend="eager"))  # what it says to pass
    # what it says to do instead: that file loads into a plain skeleton, the same function
    torch.manual_seed(0)
    model = bayesian(net())
    back = load(save(tmp_path / "p.pt", torch.compile(model, backend="eager")), module=net())
    x = torch.randn(5, 4)
    assert torch.equal(back.model.net(x), model.net(x))


# 3. fit(resume_from=) from a loader that cannot tell N ------------------------------------------
#
# N is read from the file; a file that cannot be read (absent) was passed over, and fit() asked
# for num_data=, after which it refused the file: it is now refused at once.


def test_resuming_from_an_absent_file_with_an_unsized_loader_names_the_file(tmp_path):

    model = BayesianMLP(4, 8, 3)
    batches = [(torch.randn(8, 4), torch.randint(0, 3, (8,)))]
    with pytest.raises(CheckpointError, match=r"No checkpoint at .*nope\.pt'"):
        fit(model, mean_field_guide(model), batches, epochs=2, progress=False,
            resume_from=tmp_path / "nope.pt")  # fmt: skip
