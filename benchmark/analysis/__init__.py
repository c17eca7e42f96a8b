"""Analysing run directories: loading runs (``runs``), targets (``targets``), the one statistics path (``effects``,
``stats``, ``aggregate``), the report (``report``, ``figures``, ``markdown_html``, ``report_check``) and the OP-GRPO
study (``study``, ``study_claims``, ``study_timing``). Reads runs through ``benchmark.experiments``; nothing there
imports this package."""
