"""Every paper's claim sets, one file each: a module here builds a :class:`benchmark.study.claims.ClaimSet`
and registers it (:func:`benchmark.study.claims.register`). The package imports every module in its folder,
so a new file registers itself: a second paper's claims are one file (docs/adding-a-study.md). A suite names its set
with its ``claims:`` key; ``flowzoo list`` lists them."""

from __future__ import annotations

from flowzoo.registry import discover


discover(__name__, __path__)
