"""The diffusers adapters inherit one constructor: each writes its own signature (its defaults are what the config
checks read) and hands ``DiffusersFlowModel.__init__`` every shared argument it takes, with the value it was given,
in one call (``shared_arguments(locals())``)."""

from __future__ import annotations

import inspect

import pytest

from flowzoo import models
from flowzoo.models import diffusers_common
from flowzoo.models.diffusers_common import SHARED_ARGUMENTS, DiffusersFlowModel, shared_arguments

#: the adapters that load a pipeline directory (the tiny tier builds its own modules, never the base constructor)
ADAPTERS = [name for name in models.names() if issubclass(models.get(name), DiffusersFlowModel)
            and models.get(name).pipeline_class]


class _Handed(Exception):
    """Raised by the recording base constructor: the adapter's own code after it needs a loaded pipeline."""


#: a value for each shared argument that no adapter's signature has as its default (so a dropped or swapped
#: argument shows)
GIVEN = {"lora_rank": 7, "lora_alpha": 3.5, "lora_targets": ["to_q"], "dtype": "bfloat16", "device": "meta",
         "gradient_checkpointing": True, "max_sequence_length": 77, "cache_size": 5, "finetune": "full",
         "lora_init": "kaiming", "master_weights": "bfloat16"}


def test_the_shared_arguments_are_the_base_constructors_keyword_arguments():
    base = inspect.signature(DiffusersFlowModel.__init__).parameters
    assert set(SHARED_ARGUMENTS) == {n for n, p in base.items() if p.kind is p.KEYWORD_ONLY}
    assert set(GIVEN) == set(SHARED_ARGUMENTS) - {"component_dtypes"}  # no adapter takes component_dtypes itself
    assert shared_arguments({"self": object(), "__class__": object, "resolution": 64, "lora_rank": 4}) == {"lora_rank": 4}


@pytest.mark.parametrize("name", ADAPTERS)
def test_every_shared_argument_reaches_the_base_constructor(name, monkeypatch):
    cls = models.get(name)
    assert {"sd3", "wan", "flux", "qwen_image"} <= set(ADAPTERS)
    own = inspect.signature(cls).parameters
    taken = {k: v for k, v in GIVEN.items() if k in own}
    assert set(taken) == set(GIVEN), f"{name} does not take {sorted(set(GIVEN) - set(taken))}"
    received = {}

    def recording(self, path=None, **kwargs):
        received.update(path=path, **kwargs)
        raise _Handed

    monkeypatch.setattr(diffusers_common.DiffusersFlowModel, "__init__", recording)
    with pytest.raises(_Handed):
        cls("some/dir", **taken)
    extra = {"component_dtypes": {"vae": "float32"}} if name in ("wan", "wan22") else {}  # Wan's VAE: vae_dtype
    assert received == {"path": "some/dir", **taken, **extra}
    with pytest.raises(_Handed):  # and the adapter's own defaults, not the base's, when none is given
        cls()
    defaults = {k: p.default for k, p in own.items() if k in SHARED_ARGUMENTS}
    assert received == {"path": None, **defaults, **extra}
