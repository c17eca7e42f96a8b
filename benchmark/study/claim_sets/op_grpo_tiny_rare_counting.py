"""The OP-GRPO paper's claims on the tiny tier's rare counting prompts (suite ``tiny-rare-counting-study``): the toy
study's rules (:func:`benchmark.study.claim_sets.op_grpo_paper.tiny_claims`) on the 4 counting prompts the base
model gets right least often, same reward and sampling as ``op-grpo-tiny-counting`` (docs/tiny.md); fixed with its
suite before any of its runs."""

from __future__ import annotations

from flowzoo.benchmark.study.claim_sets.op_grpo_paper import NOTE, REFERENCES, tiny_claims
from flowzoo.benchmark.study.claims import ClaimSet, register

TASK = "tiny_counting_rare"

register(ClaimSet("op-grpo-tiny-rare-counting",
                  tiny_claims(TASK, "tiny text-to-image, strict counting, rare prompts"), (TASK,), REFERENCES,
                  note=NOTE, description="the OP-GRPO paper's rules on the tiny tier's rare counting prompts "
                                         "(tiny-rare-counting-study)"))
