"""CLIP-family rewards on a tiny random CLIPModel saved and reloaded through ``from_pretrained``."""

import json

import pytest
import torch

from flowzoo import rewards
from flowzoo.errors import ConfigError
from flowzoo.rewards.clip_family import Aesthetic, ClipScore, HpsV2, PickScore
from flowzoo.rewards.score_head import ScoreHead

PROJECTION_DIM = 16


def write_tiny_clip(directory):
    """A random 2-layer CLIP with a 25-token BPE vocabulary and 32x32 image processor, saved with save_pretrained."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    vocab = ["l", "o", "w", "e", "r", "s", "t", "i", "d", "n", "a", "c", "lo", "l</w>", "w</w>", "r</w>", "t</w>",
             "low</w>", "er</w>", "lowest</w>", "newer</w>", "cat</w>", "<unk>", "<|startoftext|>", "<|endoftext|>"]
    merges = ["#version: 0.2", "l o", "lo w</w>", "e r</w>"]
    token_dir = directory / "tokenizer_src"
    token_dir.mkdir(parents=True)
    (token_dir / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    (token_dir / "merges.txt").write_text("\n".join(merges) + "\n")
    tokenizer = CLIPTokenizer.from_pretrained(token_dir, unk_token="<unk>", model_max_length=16)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    text_config = dict(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=16, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision_config = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4)
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(text_config=text_config, vision_config=vision_config, projection_dim=PROJECTION_DIM))
    model.save_pretrained(directory)
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return write_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    torch.manual_seed(1)
    file = tmp_path_factory.mktemp("head") / "aesthetic_head.pth"
    torch.save(ScoreHead(PROJECTION_DIM).state_dict(), file)
    return file


def batch():
    images = torch.rand(3, 3, 40, 48, generator=torch.Generator().manual_seed(0))
    prompts = ["a cat", "lower newer", "lowest tower of words longer than sixteen tokens " * 3]
    return images, prompts


def reference_logits(directory, images, prompts):
    """logits_per_image of the full CLIPModel forward: logit_scale.exp() * cosine of every (image, text) pair."""
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(directory).eval()
    processor = CLIPProcessor.from_pretrained(directory)
    inputs = processor(
        text=prompts, images=reward_pil(images), return_tensors="pt", padding=True, truncation=True, max_length=16
    )
    with torch.no_grad():
        return model(**inputs).logits_per_image, model.logit_scale.exp()


@pytest.mark.parametrize("cls", [ClipScore, PickScore, HpsV2])
def test_similarity_rewards_are_finite_shaped_deterministic(cls, clip_dir):
    images, prompts = batch()
    reward = cls(path=str(clip_dir))
    first, second = reward(images, prompts).score, reward(images, prompts).score
    assert first.shape == (3,) and first.dtype == torch.float32
    assert torch.isfinite(first).all()
    assert torch.equal(first, second)
    assert rewards.get(cls.name) is cls


def test_scores_match_the_clip_forward_pass(clip_dir):
    images, prompts = batch()
    logits, logit_scale = reference_logits(clip_dir, images, prompts)
    matched = logits.diagonal()
    assert PickScore(path=clip_dir)(images, prompts).score == pytest.approx(matched, abs=1e-4)
    assert ClipScore(path=clip_dir)(images, prompts).score == pytest.approx(matched / logit_scale, abs=1e-5)
    assert ClipScore(path=clip_dir, scale=100)(images, prompts).score == pytest.approx(
        100 * matched / logit_scale, abs=1e-3
    )
    # the score follows the prompt: a different prompt for the same image changes it
    swapped = ClipScore(path=clip_dir)(images, prompts[::-1]).score
    assert not torch.allclose(swapped, matched / logit_scale)


def test_path_from_environment(clip_dir, monkeypatch):
    monkeypatch.setenv("FLOWZOO_PICKSCORE_PATH", str(clip_dir))
    images, prompts = batch()
    assert torch.isfinite(PickScore()(images, prompts).score).all()


def test_aesthetic_is_the_head_on_the_normalised_image_embedding(clip_dir, head_file):
    images, prompts = batch()
    reward = rewards.build("aesthetic", {"aesthetic": {"path": str(clip_dir), "head_path": str(head_file)}})
    score = reward(images, prompts).score
    assert score.shape == (3,) and torch.isfinite(score).all()
    assert torch.equal(score, reward(images, ["ignored"] * 3).score)  # prompt-free

    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(clip_dir).eval()
    pixels = CLIPProcessor.from_pretrained(clip_dir)(images=reward_pil(images), return_tensors="pt")["pixel_values"]
    head = ScoreHead(PROJECTION_DIM)
    head.load_state_dict(torch.load(head_file))
    head.eval()
    with torch.no_grad():
        features = model.get_image_features(pixel_values=pixels)
        features = features if isinstance(features, torch.Tensor) else features.pooler_output
        expected = head(features / features.norm(dim=-1, keepdim=True))
    assert score == pytest.approx(expected, abs=1e-5)


def reward_pil(images):
    from flowzoo.rewards.weights import to_pil_images

    return to_pil_images(images, "test")


def test_aesthetic_head_of_the_wrong_size_is_a_config_error(clip_dir, tmp_path):
    wrong = tmp_path / "head.pth"
    torch.save(ScoreHead(PROJECTION_DIM + 1).state_dict(), wrong)
    with pytest.raises(ConfigError, match="head.pth"):
        Aesthetic(path=clip_dir, head_path=wrong)


ENV_VARS = [
    ("clipscore", "FLOWZOO_CLIPSCORE_PATH"),
    ("pickscore", "FLOWZOO_PICKSCORE_PATH"),
    ("hpsv2", "FLOWZOO_HPSV2_PATH"),
    ("aesthetic", "FLOWZOO_AESTHETIC_PATH"),
]


@pytest.mark.parametrize("name,env_var", ENV_VARS)
def test_missing_weights_directory_is_a_one_line_error(name, env_var, tmp_path, head_file, monkeypatch):
    monkeypatch.delenv(env_var, raising=False)
    missing = tmp_path / "no_such_weights"
    args = {"path": str(missing)}
    if name == "aesthetic":
        args["head_path"] = str(head_file)
    with pytest.raises(ConfigError) as error:
        rewards.get(name)(**args)
    message = str(error.value)
    assert "\n" not in message and str(missing) in message and env_var in message
    monkeypatch.setenv(env_var, str(missing))
    with pytest.raises(ConfigError, match="no_such_weights"):
        rewards.get(name)(**({"head_path": str(head_file)} if name == "aesthetic" else {}))
