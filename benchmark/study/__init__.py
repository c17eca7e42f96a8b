"""Studies: a suite's paired effects and verdicts on every seed set (``verdicts``), its seed sets (``seed_sets``),
the claim sets of papers (``claims``, ``claim_sets/``, ``cost_claims``), and its page (``answer``, ``page``,
``figures``, ``recipe_compare``)."""
