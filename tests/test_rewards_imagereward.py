"""ImageReward on a tiny random BLIP retrieval model saved and reloaded through ``from_pretrained``."""

import pytest
import torch

from flowzoo import rewards
from flowzoo.errors import ConfigError
from flowzoo.rewards.imagereward import IMAGEREWARD_MEAN, IMAGEREWARD_STD, ImageReward
from flowzoo.rewards.score_head import ScoreHead
from flowzoo.rewards.weights import to_pil_images

TEXT_HIDDEN = 32


@pytest.fixture(scope="module")
def blip_dir(tmp_path_factory):
    from transformers import BertTokenizer, BlipConfig, BlipForImageTextRetrieval, CLIPImageProcessor

    directory = tmp_path_factory.mktemp("tiny_blip")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "cat", "dog", "on", "the", "mat", "red", "blue"]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer.from_pretrained(directory).save_pretrained(directory)
    text_config = dict(vocab_size=len(vocab), hidden_size=TEXT_HIDDEN, intermediate_size=37, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=40, encoder_hidden_size=24)
    vision_config = dict(image_size=32, patch_size=8, hidden_size=24, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4)
    torch.manual_seed(0)
    BlipForImageTextRetrieval(BlipConfig(text_config=text_config, vision_config=vision_config)).save_pretrained(
        directory
    )
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(directory)
    # the head the way the official ImageReward.pt stores it: under "mlp.", next to backbone entries
    torch.manual_seed(1)
    head_state = {f"mlp.{k}": v for k, v in ScoreHead(TEXT_HIDDEN).state_dict().items()}
    torch.save({**head_state, "blip.unused.weight": torch.zeros(1)}, directory / "ImageReward.pt")
    return directory


def batch():
    return torch.rand(2, 3, 32, 40, generator=torch.Generator().manual_seed(0)), ["a red cat", "the dog on a mat"]


def test_finite_shaped_deterministic_and_prompt_dependent(blip_dir):
    reward = rewards.build("imagereward", {"imagereward": {"path": blip_dir, "head_path": blip_dir / "ImageReward.pt"}})
    images, prompts = batch()
    score = reward(images, prompts).score
    assert score.shape == (2,) and torch.isfinite(score).all()
    assert torch.equal(score, reward(images, prompts).score)
    assert not torch.allclose(score, reward(images, prompts[::-1]).score)


def test_matches_imagereward_score_recipe(blip_dir):
    from transformers import AutoImageProcessor, AutoTokenizer, BlipForImageTextRetrieval

    images, prompts = batch()
    score = ImageReward(path=blip_dir, head_path=blip_dir / "ImageReward.pt")(images, prompts).score

    model = BlipForImageTextRetrieval.from_pretrained(blip_dir).eval()
    pixels = AutoImageProcessor.from_pretrained(blip_dir)(to_pil_images(images, "t"), return_tensors="pt")
    tokens = AutoTokenizer.from_pretrained(blip_dir)(
        prompts, padding="max_length", truncation=True, max_length=35, return_tensors="pt"
    )
    head = ScoreHead(TEXT_HIDDEN).eval()
    head.load_state_dict({k[4:]: v for k, v in torch.load(blip_dir / "ImageReward.pt").items() if k.startswith("mlp.")})
    with torch.no_grad():
        # BlipForImageTextRetrieval's ITM branch runs exactly the image-grounded text encoder ImageReward uses
        cls = model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"],
                    pixel_values=pixels["pixel_values"], use_itm_head=True).question_embeds[:, 0, :]
        expected = (head(cls) - IMAGEREWARD_MEAN) / IMAGEREWARD_STD
    assert score == pytest.approx(expected, abs=1e-5)


def test_missing_directory_and_head_are_one_line_errors(blip_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("FLOWZOO_IMAGEREWARD_PATH", raising=False)
    missing = tmp_path / "absent_blip"
    with pytest.raises(ConfigError) as error:
        ImageReward(path=missing, head_path=blip_dir / "ImageReward.pt")
    assert "\n" not in str(error.value) and str(missing) in str(error.value)
    assert "FLOWZOO_IMAGEREWARD_PATH" in str(error.value)
    monkeypatch.delenv("FLOWZOO_IMAGEREWARD_HEAD_PATH", raising=False)
    with pytest.raises(ConfigError, match="FLOWZOO_IMAGEREWARD_HEAD_PATH"):
        ImageReward(path=blip_dir)
