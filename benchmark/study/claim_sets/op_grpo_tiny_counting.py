"""The OP-GRPO paper's claims on the tiny tier's counting task (suite ``tiny-counting-study``): the toy study's rules
(:func:`benchmark.study.claim_sets.op_grpo_paper.tiny_claims`) on the tiny tier's 12 counting prompts, strict
GenEval reward, 5 sampling steps (docs/tiny.md); fixed with its suite before any of its runs."""

from __future__ import annotations

from flowzoo.benchmark.study.claim_sets.op_grpo_paper import NOTE, REFERENCES, tiny_claims
from flowzoo.benchmark.study.claims import ClaimSet, register

TASK = "tiny_counting_sparse"

register(ClaimSet("op-grpo-tiny-counting", tiny_claims(TASK, "tiny text-to-image, strict counting"), (TASK,),
                  REFERENCES, note=NOTE,
                  description="the OP-GRPO paper's rules on the tiny tier's counting task (tiny-counting-study)"))
