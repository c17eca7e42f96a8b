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
