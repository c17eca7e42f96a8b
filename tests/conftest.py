import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def toy_prompts():
    from flowzoo.models.toy2d import prompt_set

    ps = prompt_set()
    return [p for p, _ in ps], [m for _, m in ps]


@pytest.fixture
def toy_model():
    from flowzoo import models

    return models.get("toy2d")()  # pretraining is memoised per process


@pytest.fixture
def restore_lora(model):
    """The trainable state of the test module's ``model`` fixture, put back after the test (the adapter tests train
    one module-scoped model in place)."""
    state = model.trainable_state_dict()
    yield
    model.load_trainable_state_dict(state)
