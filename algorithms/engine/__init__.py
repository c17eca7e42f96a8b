"""The engine every algorithm shares: the SDE step kernels (``sde``), rollouts and trajectories (``rollout``,
``trajectory``), step plans (``plans``), group advantages (``advantages``), the loss math (``losses``), the GRPO
iteration as a template (``base``; its hyper-parameters in ``config``, what a step reports in ``stats``, the update's
bookkeeping in ``tally``, the prompt iteration in ``prompt_iteration``, the checkpoint state in ``checkpoint_state``),
OP-GRPO's replay buffer (``replay``), the EMA (``ema``), and data parallelism with its lockstep contract
(``distributed``, ``lockstep``). Nothing here names a method; the methods live in ``algorithms/methods/``."""
