"""Analysing run directories: loading runs (``runs``), targets (``targets``), the one statistics path (``effects``,
``stats``, ``aggregate``), the report (``report``, ``figures``, ``markdown_html``, ``report_check``) and studies
(``study``, ``study_claims``, ``study_timing``; each paper's claim sets in ``claim_sets``). Reads runs through
``benchmark.experiments``; nothing there imports this package."""
