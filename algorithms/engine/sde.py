"""Per-step transition kernels of the denoising process seen as a stochastic policy.

Conventions: ``sigma`` goes from 1 (noise) to 0 (data), ``x_sigma = (1 - sigma) x0 + sigma eps``, the model's
velocity is ``v = eps - x0`` and the deterministic (ODE) Euler step is ``x + v (sigma_next - sigma)``.

Every kernel returns ``StepOutput(prev_sample, log_prob, mean, std)``. ``log_prob`` is the Gaussian log-density of
``prev_sample`` under ``N(mean, std^2)`` *averaged* over the non-batch dimensions (the reference implementations of
Flow-GRPO and DanceGRPO do this; ``reduction="sum"`` gives the true joint log-density). All math runs in float32.

Sources of the formulas:
* ``flow_grpo``: Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL" (2025), the SDE whose marginals
  match the flow ODE, eq. (9)-(12); std_t = a * sqrt(sigma / (1 - sigma)).
* ``dance_grpo``: Xue et al., "DanceGRPO" (2025): Euler step plus a score term -0.5 eta^2 * score * dt,
  score = -(x - (1 - sigma) x0) / sigma^2, std = eta sqrt(-dt).
* ``cps``: Coefficients-Preserving Sampling (Wang & Yu, 2025), as in Flow-GRPO's ``sde_type="cps"``:
  std = sigma_next sin(a pi / 2); mean = (1 - sigma_next) x0 + sqrt(sigma_next^2 - std^2) x1; its log_prob keeps only
  the quadratic term (constants and the variance dropped), as in the reference.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple, Sequence, get_args

import torch

#: the transition kernels (the one list: configs type ``kernel`` with it)
Kernel = Literal["flow_grpo", "dance_grpo", "cps"]
KINDS = get_args(Kernel)
REDUCTIONS = ("mean", "sum")
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class StepOutput(NamedTuple):
    prev_sample: torch.Tensor  # [B, ...] the next (less noisy) latent
    log_prob: torch.Tensor  # [B] log-density of prev_sample, averaged (or summed) over non-batch dims
    mean: torch.Tensor  # [B, ...] mean of the transition
    std: torch.Tensor  # [B] standard deviation of the transition (0 for a deterministic step)


def _bcast(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1, 1, ...] to broadcast against ``like``."""
    return t.reshape(t.shape[0], *([1] * (like.dim() - 1)))


def reduce_latent_dims(t: torch.Tensor, reduction: str) -> torch.Tensor:
    """[B, ...] -> [B]: the mean (as the reference implementations reduce log-densities) or the sum (a joint
    density) over the non-batch dims; the one place a log-prob or KL reduction is computed."""
    dims = tuple(range(1, t.dim()))
    if reduction == "mean":
        return t.mean(dim=dims)
    if reduction == "sum":
        return t.sum(dim=dims)
    raise ValueError(f"unknown reduction {reduction!r}; known: {', '.join(REDUCTIONS)}")


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """log N(x; mean, std^2) per element, reduced over non-batch dims. ``std`` is [B] and must be > 0."""
    s = _bcast(std, x)
    elem = -((x - mean) ** 2) / (2 * s**2) - torch.log(s) - _LOG_SQRT_2PI
    return reduce_latent_dims(elem, reduction)


#: torch's CPU normal sampler draws tensors of fewer elements than this one value at a time (its serial path), so
#: one draw of n such values equals n draws of one; from this size on it fills blocks, which gives other values
SERIAL_NORMAL_LIMIT = 16


class NoiseStreams:
    """Each sample's step noise from its own generator, drawn several steps at a time where that gives the very same
    values: for latents of fewer than ``SERIAL_NORMAL_LIMIT`` elements (the toy tier's points) a block of steps fits
    under the limit, so one ``randn`` call per sample serves several steps instead of one each (a rollout's dominant
    cost on the toy tier). :meth:`close` rewinds every generator to just after the draws that were used, so the
    generators end where per-step draws leave them. Larger latents draw step by step, as ``_noise`` does."""

    def __init__(self, generators: Sequence[torch.Generator], shape: Sequence[int], steps: int | None = None):
        self.generators = list(generators)
        self.shape = tuple(shape)
        self.numel = math.prod(self.shape)
        if self.numel < SERIAL_NORMAL_LIMIT:
            self.block = (SERIAL_NORMAL_LIMIT - 1) // self.numel
        elif steps is not None and SERIAL_NORMAL_LIMIT and self.numel % SERIAL_NORMAL_LIMIT == 0:
            # the sampler fills whole blocks of 16 values in order, so one draw of k * numel values is the k draws of
            # numel values one after another (values and generator state: tests/test_noise_streams.py); drawing all
            # of a rollout's noisy steps at once moves the noise onto the device once instead of once per step
            self.block = max(int(steps), 1)
        else:
            self.block = 1
        self._buffer: torch.Tensor | None = None
        self._states: list[torch.Tensor] = []
        self._used = 0

    def __len__(self) -> int:
        return len(self.generators)

    def draw(self, like: torch.Tensor) -> torch.Tensor:
        if self.block <= 1:
            return _noise(like, self.generators)
        if tuple(like.shape) != (len(self.generators), *self.shape):
            raise ValueError(f"noise for {tuple(like.shape)} from streams of {len(self)} x {self.shape}")
        if self._buffer is None or self._used == self.block:
            self._states = [g.get_state() for g in self.generators]
            size = (self.block * self.numel,)
            self._buffer = torch.stack([torch.randn(size, generator=g, dtype=torch.float32) for g in self.generators])
            self._used = 0
            if self.numel >= SERIAL_NORMAL_LIMIT:  # a rollout's whole block onto the device in one copy
                self._buffer = self._buffer.to(like.device)
        part = self._buffer[:, self._used * self.numel: (self._used + 1) * self.numel]
        self._used += 1
        return part.reshape(like.shape).to(like.device)

    def close(self) -> None:
        """Put each generator where the used draws leave it (the unused rest of the last block is given back)."""
        if self._buffer is not None and self._used < self.block:
            for g, state in zip(self.generators, self._states):
                g.set_state(state)
                torch.randn((self._used * self.numel,), generator=g, dtype=torch.float32)
        self._buffer = None


def _noise(like: torch.Tensor, generator: torch.Generator | list[torch.Generator] | NoiseStreams | None
           ) -> torch.Tensor:
    """Standard normal noise shaped like ``like``; a list of generators draws each sample from its own."""
    if isinstance(generator, NoiseStreams):
        return generator.draw(like)
    if isinstance(generator, (list, tuple)):
        if len(generator) != like.shape[0]:
            raise ValueError(f"got {len(generator)} generators for a batch of {like.shape[0]}")
        return torch.stack(
            [torch.randn(like.shape[1:], generator=g, dtype=torch.float32) for g in generator]
        ).to(like.device)
    return torch.randn(like.shape, generator=generator, dtype=torch.float32).to(like.device)


def flow_grpo_std(sigma: torch.Tensor, sigma_next: torch.Tensor, noise_level: float) -> torch.Tensor:
    """Flow-GRPO's diffusion coefficient std_t = a sqrt(s / (1 - s)); at s == 1 the denominator uses 1 - sigma_next."""
    denom = 1 - torch.where(sigma >= 1, sigma_next, sigma)
    return noise_level * torch.sqrt(sigma / denom)


def sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    *,
    kind: str = "flow_grpo",
    noise_level: float = 0.7,
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | list[torch.Generator] | NoiseStreams | None = None,
    reduction: str = "mean",
    deterministic: bool | None = None,
) -> StepOutput:
    """One stochastic denoising step from ``sigma`` to ``sigma_next`` (both [B], ``sigma_next < sigma``).

    With ``prev_sample`` given, it is scored instead of sampled (used to recompute log-probs in the update).
    A step with zero noise is deterministic: ``prev_sample = mean`` and ``log_prob`` is 0. ``deterministic``: whether
    it is, known from the host-side plan (:func:`deterministic_steps`); None reads it from the step's std, which on
    an accelerator waits for the device (the rollout and the update pass it).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown SDE kind {kind!r}; known: {', '.join(KINDS)}")
    out_dtype = x.dtype
    x = x.float()
    v = v.float()
    # the plan's sigmas live on the host (StepPlan): the step's math happens on the latents' device
    sigma = sigma.to(device=x.device, dtype=torch.float32).reshape(-1).expand(x.shape[0])
    sigma_next = sigma_next.to(device=x.device, dtype=torch.float32).reshape(-1).expand(x.shape[0])
    s, s_next = _bcast(sigma, x), _bcast(sigma_next, x)
    dt = s_next - s  # negative

    if kind == "flow_grpo":
        std_t = _bcast(flow_grpo_std(sigma, sigma_next, noise_level), x)
        mean = x * (1 + std_t**2 / (2 * s) * dt) + v * (1 + std_t**2 * (1 - s) / (2 * s)) * dt
        std = (std_t * torch.sqrt(-dt)).reshape(-1)
    elif kind == "dance_grpo":
        x0 = x - s * v
        score = -(x - (1 - s) * x0) / s**2
        mean = x + dt * v + (-0.5 * noise_level**2 * score) * dt
        std = (noise_level * torch.sqrt(-dt)).reshape(-1)
    else:  # cps
        x0 = x - s * v
        x1 = x + (1 - s) * v
        std_b = s_next * math.sin(noise_level * math.pi / 2)
        mean = (1 - s_next) * x0 + torch.sqrt(s_next**2 - std_b**2) * x1
        std = std_b.reshape(-1)

    if deterministic is None:
        deterministic = bool((std == 0).all())
    if prev_sample is None:
        prev_sample = mean if deterministic else mean + _bcast(std, x) * _noise(x, generator)
    prev_sample = prev_sample.float()

    if deterministic:
        log_prob = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    elif kind == "cps":
        log_prob = reduce_latent_dims(-((prev_sample.detach() - mean) ** 2), reduction)
    else:
        log_prob = gaussian_log_prob(prev_sample.detach(), mean, std, reduction)
    return StepOutput(prev_sample.to(out_dtype), log_prob, mean, std)


def deterministic_steps(kind: str, sigmas: torch.Tensor, noise_level: float) -> torch.Tensor:
    """[T] bool: which transitions of the grid ``sigmas`` [T+1] have zero noise under ``kind`` (then ``sde_step`` is
    deterministic), computed on the host with :func:`sde_step`'s own float32 formulas for the std, so that the
    sampler and the update know it without reading a device tensor (tests/test_host_syncs.py checks it against
    ``sde_step``'s std on every kind's grid)."""
    if kind not in KINDS:
        raise ValueError(f"unknown SDE kind {kind!r}; known: {', '.join(KINDS)}")
    grid = sigmas.detach().to(device="cpu", dtype=torch.float32)
    sigma, sigma_next = grid[:-1], grid[1:]
    dt = sigma_next - sigma
    if kind == "flow_grpo":
        std = flow_grpo_std(sigma, sigma_next, noise_level) * torch.sqrt(-dt)
    elif kind == "dance_grpo":
        std = noise_level * torch.sqrt(-dt)
    else:  # cps
        std = sigma_next * math.sin(noise_level * math.pi / 2)
    return std == 0


def euler_step(x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
    """The probability-flow ODE step ``x + v (sigma_next - sigma)``."""
    sigma, sigma_next = (s.to(device=x.device, dtype=torch.float32).reshape(-1).expand(x.shape[0])
                         for s in (sigma, sigma_next))
    return (x.float() + v.float() * _bcast(sigma_next - sigma, x)).to(x.dtype)


#: the sigma grids of :func:`sigma_schedule` (the one list: configs type ``sigma_grid`` with it)
SigmaGrid = Literal["diffusers", "linspace", "flux", "unipc_flow"]
SIGMA_GRIDS = get_args(SigmaGrid)


def time_shift(t: torch.Tensor | float, shift: float) -> torch.Tensor | float:
    """SD3's static time shift s = shift t / (1 + (shift - 1) t)."""
    return shift * t / (1 + (shift - 1) * t)


def inverse_time_shift(s: torch.Tensor | float, shift: float) -> torch.Tensor | float:
    """The t with ``time_shift(t, shift) == s``: t = s / (shift - (shift - 1) s), which is the shift by 1 / shift."""
    return time_shift(s, 1.0 / shift)


#: the most sampling steps a rollout or an evaluation may take (ours): released recipes use 10-50 (SD3.5 and FLUX
#: evaluate with 40 and 28-50, benchmark/recipes/*.yaml); a larger count is refused by the config check instead of
#: being allocated (2**31 steps asked 16 GiB for the sigma grid alone)
MAX_SAMPLING_STEPS = 1000


#: how far UniPC's flow grid lowers a first sigma of 1 (diffusers 0.42.1 scheduling_unipc_multistep.py:437-440)
UNIPC_FIRST_SIGMA_EPS = 1e-6


def sigma_schedule(
    num_steps: int, shift: float = 1.0, num_train_timesteps: int = 1000, grid: str = "diffusers",
    terminal: float | None = None,
) -> torch.Tensor:
    """The ``num_steps + 1`` sigmas (1 -> 0) of a sampling schedule with a static ``shift``.

    * ``grid="diffusers"``: SD3's FlowMatchEulerDiscreteScheduler. As diffusers does: sigma_min is the shifted
      1/num_train_timesteps, the grid runs linearly from 1 to sigma_min, the shift is applied to the grid, and a
      final 0 is appended.
    * ``grid="linspace"``: ``shift(linspace(1, 0, num_steps + 1))``, the grid DanceGRPO and MixGRPO build
      (XueZeyue/DanceGRPO fastvideo/train_grpo_flux.py:311-313, Tencent-Hunyuan/MixGRPO
      fastvideo/train_grpo_flux.py:187-189, both with ``sd3_time_shift``).
    * ``grid="flux"``: ``shift(linspace(1, 1/T, T))`` and a final 0, the grid ``FluxPipeline`` and
      ``QwenImagePipeline`` hand their scheduler (diffusers 0.42, pipeline_flux.py ``sigmas = np.linspace(1.0, 1 /
      num_inference_steps, num_inference_steps)``). Their resolution-dependent ``mu`` (exponential time shift
      ``e^mu / (e^mu + 1/t - 1)``) is the static shift with ``shift = e^mu``, so the adapters pass ``e^mu`` here.

    * ``grid="unipc_flow"``: the flow sigmas of diffusers' ``UniPCMultistepScheduler(use_flow_sigmas=True,
      flow_shift=shift)``, Wan2.1's scheduler (diffusers 0.42.1, scheduling_unipc_multistep.py:428-450):
      ``shift(linspace(1, 1/num_train_timesteps, T + 1)[:-1])``, the first sigma lowered by 1e-6 when it is 1 (so
      that UniPC's log(alpha) stays finite), and a final 0. The zoo's samplers take their own (SDE or Euler) steps on
      this grid, as Flow-GRPO's Wan trainer takes its own SDE step on the pipeline's UniPC sigmas; it does not run
      UniPC's multistep predictor-corrector.

    ``terminal``: diffusers' ``shift_terminal`` (Qwen-Image's scheduler: 0.02): the shifted sigmas before the final 0
    are stretched so that the last one equals it, ``1 - (1 - s) (1 - terminal) / (1 - s_last)``.

    Precision: the linspace grid is computed in float32, as the DanceGRPO and MixGRPO trainers build it (a float32
    ``torch.linspace`` and ``sd3_time_shift``), so that it is their grid to the bit (FLUX's integer timesteps truncate
    ``1000 sigma`` and a one-ulp difference moves a step by one, models/flux.py); the pipelines' grids are computed in
    float64 (their numpy) and cast to float32, as diffusers hands them to its schedulers.
    """
    if not 1 <= num_steps <= MAX_SAMPLING_STEPS:
        raise ValueError(f"num_steps must be in [1, {MAX_SAMPLING_STEPS}], got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    if grid not in SIGMA_GRIDS:
        raise ValueError(f"unknown sigma grid {grid!r}; known: {', '.join(SIGMA_GRIDS)}")
    if terminal is not None and not 0 < terminal < 1:
        raise ValueError(f"terminal must lie in (0, 1), got {terminal}")
    if grid == "linspace":
        if terminal is not None:
            raise ValueError("the linspace grid ends at 0 and takes no terminal")
        # float32 throughout, as the releases (module docstring: their grid to the bit)
        return time_shift(torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32), float(shift))
    if grid == "flux":
        body = time_shift(torch.linspace(1.0, 1.0 / num_steps, num_steps, dtype=torch.float64), shift)
    elif grid == "unipc_flow":
        body = time_shift(torch.linspace(1.0, 1.0 / num_train_timesteps, num_steps + 1, dtype=torch.float64)[:-1],
                          shift)
    else:
        sigma_min = time_shift(1.0 / num_train_timesteps, shift)
        body = time_shift(torch.linspace(1.0, sigma_min, num_steps, dtype=torch.float64), shift)
    if terminal is not None:  # diffusers FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal
        if num_steps < 2:
            raise ValueError(f"a terminal sigma needs num_steps >= 2, got {num_steps}")
        body = 1 - (1 - body) * (1 - terminal) / (1 - body[-1])
    if grid == "unipc_flow" and abs(float(body[0]) - 1.0) < UNIPC_FIRST_SIGMA_EPS:
        body[0] -= UNIPC_FIRST_SIGMA_EPS  # scheduling_unipc_multistep.py:437-440 (keeps log(alpha) finite)
    return torch.cat([body, torch.zeros(1, dtype=torch.float64)]).float()


def dpm_solver_pp_2m_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    prev_x0: torch.Tensor | None = None,
    prev_sigma: torch.Tensor | None = None,
) -> torch.Tensor:
    """One deterministic step of multistep DPM-Solver++ (2M, data-prediction form) from ``sigma`` to ``sigma_next``.

    Lu et al., "DPM-Solver++: Fast Solver for Guided Sampling of Diffusion Probabilistic Models" (arXiv 2211.01095),
    Algorithm 2, with the rectified-flow parameterisation alpha_t = 1 - sigma_t (as diffusers'
    ``DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction")``):

    * data prediction ``x0 = x - sigma v``; half log-SNR ``lambda = log(alpha / sigma)``; ``h = lambda_next - lambda``;
    * first order (DDIM): ``x_next = (s_next / s) x + alpha_next (1 - e^{-h}) x0``;
    * second order (midpoint form, the diffusers default ``solver_type="midpoint"``) when the data prediction
      ``prev_x0`` at the previous point ``prev_sigma`` is given: with ``r = h_prev / h``,
      ``D1 = (x0 - prev_x0) / r`` and ``x_next += 0.5 alpha_next (1 - e^{-h}) D1``.

    The step falls back to first order without a history and on the final step to ``sigma_next == 0`` (where
    lambda is infinite; diffusers does the same with ``final_sigmas_type="zero"``). ``alpha (1 - e^{-h})`` is
    written as ``alpha_next - alpha s_next / s`` so that sigma = 1 (alpha = 0) needs no logarithm.
    """
    out_dtype = x.dtype
    batch = x.shape[0]
    s = sigma.to(device=x.device, dtype=torch.float64).reshape(-1).expand(batch)
    s_next = sigma_next.to(device=x.device, dtype=torch.float64).reshape(-1).expand(batch)
    alpha, alpha_next = 1 - s, 1 - s_next
    x32 = x.float()
    x0 = x32 - _bcast(s.float(), x32) * v.float()
    ddim = alpha_next - alpha * s_next / s  # alpha_next (1 - e^{-h})
    x_next = _bcast((s_next / s).float(), x32) * x32 + _bcast(ddim.float(), x32) * x0
    if prev_x0 is not None and prev_sigma is not None and bool((s_next > 0).all()):
        s_prev = prev_sigma.to(device=x.device, dtype=torch.float64).reshape(-1).expand(batch)
        lam = torch.log(alpha) - torch.log(s)
        h = torch.log(alpha_next) - torch.log(s_next) - lam
        h_prev = lam - (torch.log(1 - s_prev) - torch.log(s_prev))  # +inf when prev_sigma == 1: no correction
        correction = 0.5 * ddim * h / h_prev
        x_next = x_next + _bcast(correction.float(), x32) * (x0 - prev_x0.float())
    return x_next.to(out_dtype)
