"""What a run measures besides its reward: the evaluation protocol (``evaluation``), the gold judge (``gold``), the
spread of samples (``diversity``) and the divergence stop (``divergence``). Imports nothing of the harness."""
