"""Self-review 11: forget_params reads Pyro's param store without transforming (and marking)
the entries it leaves; the own-model check's retry keeps its own error as well as the first."""

import pyro
import torch

from pyrouq._param_store import forget_params


def test_forget_params_leaves_anothers_entry_under_the_prefix_untouched():
    pyro.clear_param_store()
    store = pyro.get_param_store()
    store["someones.net$$$scale"] = torch.ones(2)
    tensor = dict(store.named_parameters())["someones.net$$$scale"]
    forget_params("someones")
    assert "someones.net$$$scale" in store
    assert "unconstrained" not in tensor.__dict__  # (a weak reference: pickle refuses it)
    pyro.clear_param_store()


def test_a_model_x_retry_that_fails_too_is_named_beside_the_first_error():
    from pyrouq.diagnostics._own_model import refuse_own_model

    def model(*args):
        if len(args) == 2:
            raise TypeError("takes x alone")
        raise RuntimeError("the retry's own failure")

    model.__signature__ = "unreadable"  # (no signature to read: model(x) is tried after)
    x, y = torch.randn(2, 3), torch.randn(2)
    try:
        refuse_own_model("to_inference_data()", model, x, y, 2)
    except ValueError as err:
        assert "takes x alone" in str(err) and "the retry's own failure" in str(err)
        assert isinstance(err.__cause__, TypeError)
    else:
        raise AssertionError("not refused")
