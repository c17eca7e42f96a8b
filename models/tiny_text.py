"""The tiny tier's text side: a word-level tokenizer built from the synthetic data's vocabulary and a small
``transformers.CLIPTextModel`` trained from scratch with the image model.

Tokenisation: lower-cased words split on spaces; text between double quotes is split into single characters (each
quote mark is a token), so ``the text "AB3"`` -> ``the text " a b 3 "``. Sequences are ``[BOS] words [EOS]`` padded
with ``[PAD]`` to ``max_length``. A word outside the vocabulary is an error: the model has never seen it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.models.tiny_data import vocabulary

PAD, BOS, UNK, EOS = "[PAD]", "[BOS]", "[UNK]", "[EOS]"
# CLIPTextModel pools the hidden state at the first EOS token unless eos_token_id == 2 (a legacy rule that takes the
# highest token id instead), so EOS must not be id 2.
SPECIAL_TOKENS = (PAD, BOS, UNK, EOS)
MAX_LENGTH = 12


def split_words(prompt: str) -> list[str]:
    words: list[str] = []
    for i, part in enumerate(prompt.split('"')):
        if i % 2:  # inside quotes: one token per character
            words += ['"', *[c.lower() for c in part if not c.isspace()], '"']
        else:
            words += part.lower().split()
    if prompt.count('"') % 2:  # an unmatched quote was swallowed by the split above
        raise ConfigError(f"tiny: unbalanced double quotes in prompt {prompt!r}")
    return words


class WordTokenizer:
    """Word -> id over a fixed vocabulary; ``__call__`` returns ``input_ids`` and ``attention_mask`` [B, max_length]."""

    def __init__(self, words: Sequence[str] | None = None, max_length: int = MAX_LENGTH):
        self.tokens = list(SPECIAL_TOKENS) + list(words if words is not None else vocabulary())
        self.ids = {token: i for i, token in enumerate(self.tokens)}
        self.max_length = int(max_length)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def pad_id(self) -> int:
        return self.ids[PAD]

    @property
    def bos_id(self) -> int:
        return self.ids[BOS]

    @property
    def eos_id(self) -> int:
        return self.ids[EOS]

    def encode(self, prompt: str) -> list[int]:
        words = split_words(prompt)
        unknown = [w for w in words if w not in self.ids]
        if unknown:
            raise ConfigError(
                f"tiny: prompt {prompt!r} has words outside the model's vocabulary: {unknown}; "
                f"known words: {' '.join(self.tokens[len(SPECIAL_TOKENS):])}"
            )
        ids = [self.bos_id, *(self.ids[w] for w in words), self.eos_id]
        if len(ids) > self.max_length:
            raise ConfigError(f"tiny: prompt {prompt!r} has {len(ids)} tokens, more than max_length {self.max_length}")
        return ids

    def __call__(self, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
        rows = [self.encode(p) for p in prompts]
        input_ids = torch.full((len(rows), self.max_length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), self.max_length), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return {"input_ids": input_ids, "attention_mask": mask}


def build_text_encoder(tokenizer: WordTokenizer, width: int, layers: int, heads: int, seed: int = 0):
    """A randomly initialised ``CLIPTextModel`` sized for the tokenizer (seeded, so a fresh model is reproducible)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=tokenizer.max_length,
        pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        projection_dim=width,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CLIPTextModel(config)
