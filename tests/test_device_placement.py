"""Device placement and dtype guards that run without an accelerator (issue 31, item 2; docs/perf.md, "Device
placement").

A CPU-only build cannot put a tensor on a second device, so placement is checked on the source: every tensor
constructor in the rollout, update, replay, reward-glue, adapter and evaluation code names its ``device=`` (or is a
``*_like`` / ``new_*`` form, which inherits it), every explicit move to the host (``.cpu()``, ``.to("cpu")``,
``.numpy()``) and every constructor pinned to the CPU is an exception with a reason, and every ``torch.load`` passes
``map_location``. The exceptions are :data:`ALLOWED`; one that no longer matches the code fails too, so the list
stays true.

The dtype test trains one iteration of every registered algorithm (two for OP-GRPO, whose second iteration replays)
with the toy and the tiny tier's networks in float64 and records, through a ``TorchFunctionMode``, every float32 (or
narrower) tensor the zoo's own code makes from float64 inputs or from nothing (a factory without a float64 dtype, a
cast of a mask). Each must be one the contract asks for (:data:`FLOAT32_BY_CONTRACT`: the transition kernels compute in
float32 whatever the input dtype, the noise is drawn in float32 from CPU generators, rewards score in float32, ...),
so that the bf16 path on an accelerator has no hidden cast either.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import sys
import textwrap
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest
import torch
from torch.overrides import TorchFunctionMode

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.engine.rollout import sample_generators, sample_ode
from flowzoo.algorithms.engine.sde import sigma_schedule
from flowzoo.rewards.base import Reward, RewardOutput

ROOT = Path(__file__).resolve().parent.parent

# ---- the structural scan --------------------------------------------------------------------------------------------

#: torch functions that create a tensor (on the CPU unless told otherwise); ``*_like`` and ``Tensor.new_*`` inherit the
#: device of their input and are not listed
CONSTRUCTORS = frozenset({
    "zeros", "ones", "empty", "full", "arange", "range", "tensor", "as_tensor", "scalar_tensor", "empty_strided",
    "rand", "randn", "randint", "randperm", "normal", "linspace", "logspace", "eye", "from_numpy", "frombuffer",
    "Tensor", "FloatTensor", "DoubleTensor", "LongTensor", "IntTensor", "BoolTensor", "ByteTensor",
})

def _runner_path() -> str:
    """The runner's file (``benchmark/run/runner.py``, or wherever a reorganisation of ``benchmark/`` puts it)."""
    for path in sorted((ROOT / "benchmark").glob("**/runner.py")):
        if "class Runner" in path.read_text():
            return path.relative_to(ROOT).as_posix()
    raise AssertionError("no module of benchmark/ defines class Runner")


RUNNER = _runner_path()

#: the scanned code: a file and, where only part of it runs in training or evaluation, the qualified names (classes,
#: functions) whose bodies are scanned; the toy tier's pretraining and the tiny tier's tokenizer run on the CPU
#: by design and are not scanned
SCANNED: dict[str, tuple[str, ...] | None] = {
    **{p.relative_to(ROOT).as_posix(): None for part in ("engine", "methods")
       for p in sorted((ROOT / "algorithms" / part).glob("*.py"))},
    **{f"algorithms/prompt_samplers/{p.name}": None
       for p in sorted((ROOT / "algorithms" / "prompt_samplers").glob("*.py"))},
    "models/base.py": None,
    "models/diffusers_common.py": None,
    "models/sd3.py": None,
    "models/wan.py": None,
    "models/tiny.py": ("TinyModel", "text_embeddings", "transformer_velocity"),
    "models/toy2d.py": ("VelocityMLP", "Toy2DModel"),
    "rewards/base.py": None,
    "rewards/multi.py": None,
    "rewards/pool.py": None,
    "rewards/toy.py": None,
    RUNNER: ("Runner.evaluate", "Runner._score_samples", "Runner._checkpoint", "Runner._load_checkpoint"),
}


class Finding(NamedTuple):
    path: str  # relative to the repository
    where: str  # the enclosing qualified name ("<module>" at top level)
    call: str  # the call's source (ast.unparse)
    what: str  # "no device", "pinned to the CPU", "moves to the CPU", "no map_location"
    line: int


def _is_cpu(node: ast.expr) -> bool:
    """A literal CPU device: ``"cpu"`` or ``torch.device("cpu")``."""
    if isinstance(node, ast.Constant):
        return node.value == "cpu"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "device"
            and len(node.args) == 1 and _is_cpu(node.args[0]))


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str, scope: tuple[str, ...] | None):
        self.path, self.scope = path, scope
        self.stack: list[str] = []
        self.torch_names: set[str] = set()  # names bound to the torch module (import torch [as t])
        self.imported: dict[str, str] = {}  # local name -> torch constructor (from torch import zeros [as z])
        self.findings: list[Finding] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "torch":
                self.torch_names.add(alias.asname or "torch")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "torch":
            for alias in node.names:
                if alias.name in CONSTRUCTORS or alias.name == "load":
                    self.imported[alias.asname or alias.name] = alias.name

    def _scoped(self, node: ast.AST) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def _in_scope(self) -> bool:
        where = ".".join(self.stack)
        return self.scope is None or any(where == s or where.startswith(s + ".") for s in self.scope)

    def _torch_function(self, func: ast.expr) -> str | None:
        """The torch function a call's ``func`` names (``torch.zeros``, ``t.zeros``, an imported ``zeros``)."""
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.torch_names:
            return func.attr
        if isinstance(func, ast.Name) and func.id in self.imported:
            return self.imported[func.id]
        return None

    def visit_Call(self, node: ast.Call) -> None:
        if self._in_scope():
            self._check(node)
        self.generic_visit(node)

    def _check(self, node: ast.Call) -> None:
        keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
        name = self._torch_function(node.func)
        what = None
        if name in CONSTRUCTORS:
            if "device" not in keywords:
                what = "no device"
            elif _is_cpu(keywords["device"]):
                what = "pinned to the CPU"
        elif name == "load":
            if "map_location" not in keywords and len(node.args) < 2:
                what = "no map_location"
        elif isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in ("cpu", "numpy"):
                what = "moves to the CPU"
            elif method == "to" and (any(_is_cpu(a) for a in node.args) or _is_cpu(keywords.get("device", ast.Pass()))):
                what = "moves to the CPU"
        if what is not None:
            self.findings.append(Finding(self.path, ".".join(self.stack) or "<module>", ast.unparse(node), what,
                                         node.lineno))


def scan_source(source: str, path: str, scope: tuple[str, ...] | None = None) -> list[Finding]:
    """The placement findings of one file's ``source`` (``scope``: see :data:`SCANNED`)."""
    scanner = _Scanner(path, scope)
    scanner.visit(ast.parse(source))
    return scanner.findings


def scan_code() -> list[Finding]:
    return [f for path, scope in SCANNED.items() for f in scan_source((ROOT / path).read_text(), path, scope)]


# Reasons shared by several entries.
GENERATOR = ("drawn from a CPU torch.Generator (the zoo's noise and orders are pure functions of seed, iteration and "
             "sample index, the same on every device): a host draw")
HOST_PLAN = ("the step plan is host-side control data (algorithms/engine/trajectory.py StepPlan): reading its masks needs no "
             "device sync; the kernels move the sigmas they use onto the latents' device")
HOST_GRID = ("the plan's zero-noise steps computed on the host from its host grid (a no-op move: plans are host-side), "
             "so that neither the rollout nor the update reads a device tensor to know them")
HOST_INDEX = ("host-side index or group ids: CPU integer tensors index device tensors as they are (Trajectory's "
              "placement)")
LOGGING = "logging only: a host value that is reduced and written to metrics.csv, never met by device math"
CHECKPOINT = "checkpoint: state_dict copies onto the host; load_state_dict puts them back on the parameters' device"
COLLECTIVE = "all_gather_object pickles host tensors; the result is moved back onto the caller's device"
BUFFER = ("the replay buffer keeps its entries on the host (accelerator memory stays the batch's); _replay_inputs "
          "moves the replayed ones onto the device once")
PLAN_VS_BUFFER = "the plan compared with the buffer's host entries (a no-op: plans are host-side already)"

#: (file, call source) -> why this constructor or move to the host is right. A call listed here is allowed wherever it
#: appears in that file; a call of the same file whose source differs is a new finding.
ALLOWED: dict[tuple[str, str], str] = {
    # ---- the template (algorithms/engine/base.py and its parts; docs/perf.md "Device placement": what is to change)
    ("algorithms/engine/tally.py", "torch.tensor(counts[2 * i:2 * i + 2], dtype=torch.float64)"):
        LOGGING + " (UpdateTally's clip counts, built from the host copy of its sums for the collective)",
    ("algorithms/engine/tally.py", "torch.tensor(counts[2 * len(self.subsets):], dtype=torch.float64)"):
        LOGGING + " (UpdateTally's clip counts by advantage sign, from the host copy of its sums for the collective)",
    ("algorithms/engine/base.py", "torch.zeros(batch, self.num_steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/engine/sde.py", "sigmas.detach().to(device='cpu', dtype=torch.float32)"): HOST_GRID,
    ("algorithms/engine/base.py", "torch.ones(self.num_steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/engine/prompt_iteration.py", "batch.rewards.detach().cpu()"):
        "the prompt sampler's outcomes (GroupOutcome) are host-side bookkeeping: one explicit move per step",
    ("algorithms/engine/prompt_iteration.py", "batch.group.cpu()"): HOST_INDEX + " (group ids of the sampler's outcomes)",
    ("algorithms/engine/base.py", "torch.arange(group_offset, group_offset + len(prompts))"): HOST_INDEX + " (group ids)",
    ("algorithms/engine/base.py", "torch.nonzero(self.dist.cat(advantages) != 0).squeeze(1).cpu()"):
        HOST_INDEX + " (the kept rows, permuted with the host update generator)",
    ("algorithms/engine/base.py", "torch.randperm(batch, generator=self.update_generator)"): GENERATOR,
    ("algorithms/engine/base.py", "torch.randperm(len(kept), generator=self.update_generator)"): GENERATOR,
    ("algorithms/engine/config.py", "torch.arange(batch)"):
        HOST_INDEX + " (ordered_rows: the update's minibatch order, a host permutation as the generator's)",
    # ---- plans and kernels
    ("algorithms/engine/plans.py", "torch.zeros(num_steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/engine/plans.py", "torch.randperm(candidates, generator=generator)"): GENERATOR,
    ("algorithms/engine/plans.py", "torch.zeros(batch, num_steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/engine/plans.py", "torch.linspace(float(start), 0.0, points, dtype=torch.float64)"): HOST_PLAN,
    ("algorithms/engine/sde.py", "torch.randn(like.shape[1:], generator=g, dtype=torch.float32)"):
        GENERATOR + "; moved onto the latents' device on the same line",
    ("algorithms/engine/sde.py", "torch.randn(like.shape, generator=generator, dtype=torch.float32)"):
        GENERATOR + "; moved onto the latents' device on the same line",
    ("algorithms/engine/sde.py", "torch.randn(size, generator=g, dtype=torch.float32)"):
        GENERATOR + "; NoiseStreams.draw moves each step's part onto the latents' device",
    ("algorithms/engine/sde.py", "torch.randn((self._used * self.numel,), generator=g, dtype=torch.float32)"):
        GENERATOR + " (NoiseStreams.close advances the host generators; the values are not used)",
    ("algorithms/engine/sde.py", "torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32)"): HOST_PLAN
        + " (the linspace grid built in float32, as DanceGRPO and MixGRPO build it)",
    ("algorithms/engine/sde.py", "torch.linspace(1.0, 1.0 / num_train_timesteps, num_steps + 1, dtype=torch.float64)"):
        HOST_PLAN + " (UniPC's flow grid, Wan's)",
    ("algorithms/engine/sde.py", "torch.linspace(1.0, sigma_min, num_steps, dtype=torch.float64)"): HOST_PLAN,
    ("algorithms/engine/sde.py", "torch.linspace(1.0, 1.0 / num_steps, num_steps, dtype=torch.float64)"): HOST_PLAN,
    ("algorithms/engine/sde.py", "torch.zeros(1, dtype=torch.float64)"): HOST_PLAN,
    ("algorithms/methods/dance_grpo.py", "torch.ones(self.num_steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/methods/mix_grpo.py", "torch.zeros(sigmas.shape[0] - 1, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/methods/mix_grpo.py", "torch.randint(0, last + 1, (1,), generator=gen)"): GENERATOR + " (the window start)",
    ("algorithms/methods/flow_grpo_fast.py",
     "torch.randint(0, self.window_range - self.config.sde_window_size + 1, (1,), generator=gen)"):
        GENERATOR + " (the window start)",
    # ---- trajectories, OP-GRPO and its replay buffer
    ("algorithms/engine/trajectory.py", "torch.zeros(b, dtype=torch.bool)"): HOST_INDEX + " (the off-policy flags)",
    ("algorithms/engine/trajectory.py", "torch.as_tensor(idx, dtype=torch.long, device='cpu')"):
        HOST_INDEX + ": select indexes the host fields (plan rows, groups, flags) as well as the device ones",
    ("algorithms/methods/op_grpo.py", "plan.sigmas.cpu()"): PLAN_VS_BUFFER,
    ("algorithms/methods/op_grpo.py", "batch.rewards.detach().to('cpu')"):
        "the buffer's admission reads the batch's rewards on the host, in one copy (not one read per group)",
    ("algorithms/methods/op_grpo.py", "traj.rewards.detach().to('cpu')"):
        "the buffer picks each group's best trajectory on the host, from one copy of the rewards",
    ("algorithms/methods/op_grpo.py", "torch.tensor([best for _, best in chosen], dtype=torch.long)"): HOST_INDEX
        + " (the groups' best rows, moved onto the device once to gather them)",
    ("algorithms/methods/op_grpo.py", "traj.latents[index.to(traj.latents.device), :keep].detach().to('cpu', copy=True)"):
        BUFFER + " (the groups' best latents in one copy)",
    ("algorithms/methods/op_grpo.py", "traj.log_probs[index.to(traj.log_probs.device)].detach().to('cpu', copy=True)"):
        BUFFER + " (the groups' best log-probs in one copy)",
    ("algorithms/methods/op_grpo.py", "plan.sde.cpu()"): PLAN_VS_BUFFER,
    ("algorithms/methods/op_grpo.py", "plan.train.cpu()"): PLAN_VS_BUFFER,
    ("algorithms/methods/op_grpo.py", "torch.rand((), generator=gen)"): GENERATOR + " (which groups replay)",
    ("algorithms/methods/op_grpo.py", "torch.randperm(len(eligible), generator=gen)"): GENERATOR + " (which groups replay)",
    ("algorithms/methods/op_grpo.py", "torch.tensor([i for i, _ in order])"): HOST_INDEX + " (group ids)",
    ("algorithms/methods/op_grpo.py", "torch.tensor(idx)"): HOST_INDEX + " (group ids)",
    ("algorithms/methods/op_grpo.py", "torch.arange(len(everyone.prompts))"): HOST_INDEX + " (the off-policy flags)",
    ("algorithms/methods/op_grpo.py", "torch.zeros(traj.num_steps)"): LOGGING + " (per-step |log-ratio| sums and counts)",
    ("algorithms/methods/op_grpo.py", "torch.zeros(self.num_steps)"): LOGGING + " (per-step |log-ratio| sums and counts)",
    ("algorithms/methods/op_grpo.py", "torch.where(ok, (old_r - off_r).abs(), zero).sum(0).cpu()"):
        LOGGING + " (per-step |log-ratio| sums)",
    ("algorithms/methods/op_grpo.py", "ok.sum(0).float().cpu()"): LOGGING + " (per-step |log-ratio| counts)",
    ("algorithms/methods/op_grpo.py", "traj.train[best:best + 1].detach().to('cpu', copy=True)"): BUFFER + " (the entry's plan row)",
    ("algorithms/engine/replay.py", "torch.zeros(1, len(sde), dtype=torch.bool)"): HOST_PLAN + " (an old entry's grid)",
    ("algorithms/engine/trajectory.py", "self.sigmas.cpu()"): HOST_PLAN + " (grids compared on the host)",
    ("algorithms/engine/trajectory.py", "other.sigmas.cpu()"): HOST_PLAN + " (grids compared on the host)",
    ("algorithms/engine/trajectory.py", "self.sde.cpu()"): HOST_PLAN + " (grids compared on the host)",
    ("algorithms/engine/trajectory.py", "other.sde.cpu()"): HOST_PLAN + " (grids compared on the host)",
    ("algorithms/methods/op_grpo.py", "traj.sigmas.detach().to('cpu', copy=True)"): BUFFER,
    ("algorithms/methods/op_grpo.py", "traj.sde.detach().to('cpu', copy=True)"): BUFFER,
    ("algorithms/prompt_samplers/replay_buffer.py", "torch.randperm(len(stored), generator=gen)"): GENERATOR,
    ("algorithms/prompt_samplers/replay_buffer.py", "torch.zeros(0)"):
        "the sampler's own prompt list stores no trajectory: empty host placeholders, never replayed",
    # ---- the decoupled methods' forward-process draws
    ("algorithms/methods/diffusion_nft.py", "torch.zeros(steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/methods/diffusion_nft.py", "torch.ones(steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/methods/diffusion_nft.py", "torch.zeros(batch, steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/methods/diffusion_nft.py", "torch.randperm(self.num_steps, generator=gen)"):
        GENERATOR + " (indices into the host sigma grid)",
    ("algorithms/engine/plans.py", "torch.randn((k, *like.shape[1:]), generator=gen, dtype=torch.float32)"):
        GENERATOR + "; stacked and moved onto the samples' device and dtype in the same function",
    ("algorithms/methods/diffusion_nft.py", "full_tensor(w.detach()).cpu()"): CHECKPOINT,
    ("algorithms/methods/awm.py", "torch.zeros(0, dtype=torch.long)"): GENERATOR + " (index arithmetic on the draws)",
    ("algorithms/methods/awm.py", "torch.zeros(1, dtype=torch.long)"): GENERATOR + " (index arithmetic on the draws)",
    ("algorithms/methods/awm.py", "torch.linspace(first, top, strata + 1)"): GENERATOR + " (the strata of the draws)",
    ("algorithms/methods/awm.py", "torch.rand(strata, generator=generator)"): GENERATOR,
    ("algorithms/methods/awm.py", "torch.rand(count, generator=generator)"): GENERATOR,
    ("algorithms/methods/awm.py", "torch.arange(count)"): GENERATOR + " (the strata of the draws)",
    ("algorithms/methods/awm.py", "torch.randperm(count, generator=generator)"): GENERATOR,
    ("algorithms/methods/awm.py", "torch.zeros(steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/methods/awm.py", "torch.ones(steps, dtype=torch.bool)"): HOST_PLAN,
    ("algorithms/methods/awm.py", "torch.zeros(batch, steps, dtype=torch.bool)"): HOST_PLAN,
    # ---- state and collectives
    ("algorithms/engine/ema.py", "full_tensor(t.detach()).cpu()"): CHECKPOINT,
    ("algorithms/engine/distributed.py", "tensor.detach().cpu()"): COLLECTIVE,
    ("algorithms/engine/distributed.py", "v.detach().cpu()"): COLLECTIVE,
    ("algorithms/engine/distributed.py", "value.detach().cpu()"): COLLECTIVE,
    # ---- models, rewards, evaluation
    ("models/base.py", "torch.as_tensor(list(idx), dtype=torch.long)"): HOST_INDEX + " (Condition.index of a list)",
    ("models/base.py", "torch.randn(self.latent_shape, generator=g, dtype=torch.float32)"):
        GENERATOR + "; stacked and moved onto the model's device in latent_dtype in the same function",
    ("models/wan.py", "torch.tensor(vae.config.latents_mean)"):
        "the VAE config's Python list, moved onto the latents' device and dtype (.to(latents)) on the same line",
    ("models/wan.py", "torch.tensor(vae.config.latents_std)"):
        "the VAE config's Python list, moved onto the latents' device and dtype (.to(latents)) on the same line",
    ("rewards/pool.py", "samples.detach().to('cpu', copy=True)"):
        "evaluation scores a host snapshot in a background thread (the caller may reuse its tensors); the scores "
        "are logged",
    (RUNNER, "decoded.cpu()"): LOGGING + " (the evaluation's sample images)",
    (RUNNER, "torch.zeros(0)"): LOGGING + " (an evaluation shard without samples)",
}


def _unallowed(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if (f.path, f.call) not in ALLOWED]


def _describe(findings: list[Finding]) -> str:
    return "\n".join(f"  {f.path}:{f.line} in {f.where}: {f.call}  ({f.what})" for f in findings)


def test_every_tensor_is_made_on_a_device_or_is_an_allowed_host_tensor():
    """A constructor without ``device=`` (or pinned to the CPU), a move to the host or a ``torch.load`` without
    ``map_location`` in the scanned code is either in ALLOWED with its reason or a placement bug."""
    bad = _unallowed(scan_code())
    assert not bad, ("tensors made or moved without naming a device (create them with device= from an input, or "
                     "new_*/*_like; or add an ALLOWED entry with the reason it belongs on the host):\n"
                     + _describe(bad))


def test_allowed_entries_match_the_code_and_give_a_reason():
    """Every ALLOWED entry names a call that exists (an entry whose line was fixed or removed must go) and says why."""
    found = {(f.path, f.call) for f in scan_code()}
    stale = sorted(key for key in ALLOWED if key not in found)
    assert not stale, "ALLOWED entries that match no call any more (remove them):\n" + "\n".join(
        f"  {path}: {call}" for path, call in stale)
    assert all(len(reason) > 20 for reason in ALLOWED.values())
    assert all(path in SCANNED for path, _ in ALLOWED)


SNIPPET = """
import torch
import torch as th
from torch import zeros as z, load


def f(x, n, path):
    a = torch.zeros(n)
    b = torch.zeros(n, device=x.device)
    c = x.new_zeros(n)
    d = torch.zeros_like(x)
    e = torch.ones(n, device="cpu")
    g = x.detach().cpu()
    h = x.to(torch.device("cpu"))
    i = x.to(x.device)
    j = th.arange(n)
    k = z(n)
    m = torch.load(path)
    o = load(path, map_location="cpu")
    p = torch.randn(n, generator=None, device=x.device)
"""


def test_the_scan_flags_constructors_without_a_device_and_host_moves():
    found = {(f.call, f.what) for f in scan_source(SNIPPET, "snippet.py")}
    assert found == {
        ("torch.zeros(n)", "no device"),
        ("torch.ones(n, device='cpu')", "pinned to the CPU"),
        ("x.detach().cpu()", "moves to the CPU"),
        ("x.to(torch.device('cpu'))", "moves to the CPU"),
        ("th.arange(n)", "no device"),
        ("z(n)", "no device"),
        ("torch.load(path)", "no map_location"),
    }


@pytest.mark.parametrize("path, function", [("algorithms/engine/losses.py", "ppo_clip_loss"),
                                            ("algorithms/engine/base.py", "Algorithm.update"),
                                            ("algorithms/engine/replay.py", "ReplayBuffer.offer"),
                                            ("rewards/base.py", "Reward.__call__")])
def test_a_new_zeros_without_a_device_in_the_real_code_fails_the_scan(path, function):
    """``torch.zeros(n)`` added to a function of the update, replay or reward glue is caught."""
    tree = ast.parse((ROOT / path).read_text())
    owner, _, name = function.rpartition(".")
    scope = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner) if owner else tree
    target = next(n for n in ast.iter_child_nodes(scope) if isinstance(n, ast.FunctionDef) and n.name == name)
    target.body.insert(0, ast.parse("extra = torch.zeros(n)").body[0])
    bad = _unallowed(scan_source(ast.unparse(tree), path, SCANNED[path]))
    assert [(f.where, f.call, f.what) for f in bad] == [(function, "torch.zeros(n)", "no device")]


# ---- the dtype test --------------------------------------------------------------------------------------------------

#: floating dtypes narrower than float64: a float64 run that produces one has computed something in lower precision
NARROW = (torch.float32, torch.float16, torch.bfloat16)
#: torch's own files through which a Tensor method or a functional reaches the mode (skipped to find the caller)
_DISPATCH = {Path(torch.__file__).parent / name for name in ("overrides.py", "_tensor.py", "functional.py")} | {
    Path(torch.__file__).parent / "nn" / "functional.py"}

#: (file, function) -> (the torch operations whose float32 results are expected there, why): what the contract
#: computes in float32 whatever the model's dtype. A float32 result made anywhere else, or by another operation, fails.
KERNELS = ("the transition kernels compute in float32 whatever the input dtype (algorithms/engine/sde.py, module docstring): "
           "the log-probs, the KL and the sampler's arithmetic are float32 by contract; the latents keep their dtype")
NOISE = ("noise is drawn in float32 from each sample's CPU generator, the same numbers whatever the model's dtype or "
         "device, then cast to the latents' dtype")
GRID = "the sigma grid is float32, as diffusers' FlowMatchEulerDiscreteScheduler builds it (a host-side plan tensor)"
LOG_PROBS = "log-probabilities and what is built from them are float32 (the kernels' log-prob contract)"
REWARD = ("decoded samples and rewards are float32 (RewardOutput): the reward boundary, through which no gradient "
          "flows")
HOST_LOGGING = "logging only: host values reduced for metrics.csv"
FLOAT32_BY_CONTRACT: dict[tuple[str, str], tuple[frozenset[str], str]] = {
    ("algorithms/engine/sde.py", "sde_step"): (frozenset({"float"}), KERNELS),
    ("algorithms/engine/sde.py", "euler_step"): (frozenset({"float"}), KERNELS),
    ("algorithms/engine/sde.py", "dpm_solver_pp_2m_step"): (frozenset({"float"}), KERNELS),
    ("algorithms/engine/sde.py", "_noise"): (frozenset({"randn"}), NOISE),
    ("algorithms/engine/sde.py", "NoiseStreams.draw"): (frozenset({"randn"}), NOISE),
    ("algorithms/engine/sde.py", "NoiseStreams.close"): (frozenset({"randn"}), NOISE),
    ("algorithms/engine/sde.py", "sigma_schedule"): (frozenset({"float", "linspace"}), GRID),
    ("algorithms/engine/plans.py", "compressed_tail_sigmas"): (frozenset({"to"}), GRID + " (MixGRPO-Flash's tail joins it)"),
    ("algorithms/engine/rollout.py", "rollout"): (frozenset({"zeros"}), LOG_PROBS + " (the behaviour log-probs [B, T])"),
    ("algorithms/engine/base.py", "Algorithm.fresh_rollout"): (
        frozenset({"zeros"}), KERNELS + " (the step means [B, T, ...] the rollout records for Flow-DPPO and GRPO-Guard "
                                        "are sde_step's float32 means)"),
    ("algorithms/engine/rollout.py", "_data_prediction"): (
        frozenset({"float"}), "the last step's data prediction is float32, as DanceGRPO's released pred_original "
                              "(it is what the reward decodes) and as the DPM-Solver++ history"),
    ("algorithms/engine/trajectory.py", "Trajectory.__post_init__"): (
        frozenset({"zeros"}), LOG_PROBS + " (OP-GRPO's log-weight, a sum of log-prob differences)"),
    ("algorithms/engine/losses.py", "sequence_log_weight"): (frozenset({"to"}), LOG_PROBS + " (the reused-step mask)"),
    ("algorithms/methods/op_grpo.py", "OPGRPO._weigh_replayed"): (frozenset({"zeros", "float"}),
                                                         HOST_LOGGING + " (per-step |log-ratio| sums and counts)"),
    ("algorithms/methods/op_grpo.py", "OPGRPO._hybrid_batch"): (frozenset({"zeros"}), HOST_LOGGING + " (placeholders)"),
    ("algorithms/methods/op_grpo.py", "OPGRPO.after_update"): (frozenset({"float"}), HOST_LOGGING + " (off-policy share)"),
    ("algorithms/methods/op_grpo.py", "OPGRPO._choose_groups"): (frozenset({"rand"}),
                                                        "a host draw that chooses the replaying groups"),
    ("algorithms/methods/awm.py", "draw_times"): (frozenset({"linspace", "rand"}),
                                          "AWM's training times are drawn in float32 from the sample's CPU generator, "
                                          "as the release draws them"),
    ("algorithms/engine/plans.py", "forward_draws"): (frozenset({"randn"}), NOISE),
    ("models/base.py", "FlowModel.initial_noise"): (frozenset({"randn"}), NOISE),
    ("models/toy2d.py", "Toy2DModel.decode"): (frozenset({"float"}), REWARD),
    ("models/diffusers_common.py", "DiffusersFlowModel._to_unit_range"): (frozenset({"float"}), REWARD),
    ("rewards/toy.py", "_targets"): (frozenset({"tensor"}), REWARD),
}


def _floating(obj) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _floating(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _floating(item)


def _function_name(code) -> str:
    """The qualified name of a code object without ``<locals>`` and comprehension frames (``f.<locals>.<listcomp>``
    is ``f``, as Python 3.12 inlines comprehensions)."""
    parts = [p for p in code.co_qualname.split(".") if not p.startswith("<")]
    return ".".join(parts) or "<module>"


class Float32Recorder(TorchFunctionMode):
    """Records, per (file, function, operation) of the zoo's own code, the torch operations that return a float32 (or
    narrower) tensor from float64 inputs, or from no floating input at all (a factory, a cast of a mask or of ints);
    a float32 result computed from float32 inputs only is propagation, not recorded again. Also records the dtypes
    ``backward`` is called on."""

    def __init__(self) -> None:
        super().__init__()
        self.events: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.backward: set[torch.dtype] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.Tensor.backward:
            self.backward.add(args[0].dtype)
            return out
        if any(t.dtype in NARROW for t in _floating(out)):
            inputs = [t.dtype for t in _floating((args, kwargs))]
            if not inputs or torch.float64 in inputs:
                self._record(getattr(func, "__name__", repr(func)))
        return out

    def _record(self, operation: str) -> None:
        frame = sys._getframe(2)
        while frame is not None and Path(frame.f_code.co_filename) in _DISPATCH:
            frame = frame.f_back
        if frame is None:
            return
        path = Path(frame.f_code.co_filename).resolve()
        if ROOT not in path.parents or ".venv" in path.parts or path.parts[len(ROOT.parts)] == "tests":
            return  # libraries (torch's optimizers, diffusers) and the tests' own helpers are not the zoo's code
        self.events[(str(path.relative_to(ROOT)), _function_name(frame.f_code), operation)] += 1


def _unexpected(events) -> list[str]:
    bad = []
    for (path, function, operation), count in sorted(events.items()):
        allowed = FLOAT32_BY_CONTRACT.get((path, function))
        if allowed is None or operation not in allowed[0]:
            bad.append(f"  {path} {function}: {operation} -> float32 ({count}x)")
    return bad


class _Observed(NamedTuple):
    latents: set
    log_probs: set
    velocities: set
    grads: set
    params: set
    backward: set
    events: collections.Counter
    replayed: bool  # an update trained on replayed (off-policy) samples


def _train_float64(model, reward, name: str, config: dict, prompts, metadata, iterations: int) -> _Observed:
    """``iterations`` training iterations of algorithm ``name`` under the recorder, with what they computed in."""
    latents, log_probs, velocities, replayed = set(), set(), set(), []
    predict = model.predict

    def recorded_predict(x, sigma, cond):
        v = predict(x, sigma, cond)
        velocities.add(v.dtype)
        return v

    model.predict = recorded_predict
    recorder = Float32Recorder()
    with recorder:
        algorithm = algorithms.get(name)(model, reward, config, seed=0)
        update = algorithm.update

        def recorded_update(traj, advantages):
            latents.add(traj.latents.dtype)
            log_probs.add(traj.log_probs.dtype)
            replayed.append(bool(traj.off_policy.any()))
            return update(traj, advantages)

        algorithm.update = recorded_update
        for _ in range(iterations):
            algorithm.step(prompts, metadata)
        sigmas = sigma_schedule(4)  # and an evaluation: deterministic ODE samples
        cond = model.encode(prompts[:2], metadata[:2])
        x = sample_ode(model, cond, sigmas, model.initial_noise(sample_generators(1, count=len(cond))))
        latents.add(x.dtype)
    params = model.trainable_parameters()
    return _Observed(latents, log_probs, velocities, {p.grad.dtype for p in params if p.grad is not None},
                     {p.dtype for p in params}, recorder.backward, recorder.events, any(replayed))


def _check_float64(name: str, seen: _Observed) -> None:
    bad = _unexpected(seen.events)
    assert not bad, f"{name}: float32 computed where the contract does not ask for it:\n" + "\n".join(bad)
    assert seen.params == {torch.float64} and seen.grads == {torch.float64}, (seen.params, seen.grads)
    assert seen.latents == {torch.float64} and seen.velocities == {torch.float64}, (seen.latents, seen.velocities)
    assert seen.log_probs == {torch.float32}  # the kernels' contract
    likelihood_free = algorithms.get(name).likelihood_free
    # the decoupled methods' losses are float64 (their math upcasts, never narrows); the PPO loss of the
    # log-prob methods is float32, as their log-probs
    assert seen.backward == ({torch.float64} if likelihood_free else {torch.float32}), seen.backward
    assert seen.replayed == name.startswith("op_grpo")  # OP-GRPO's second iteration replays stored samples


#: {tier: {algorithm: what its float64 run recorded}}, for the stale-entry check below
_SEEN: dict[str, dict[str, collections.Counter]] = {"toy": {}, "tiny": {}}

TOY_CONFIG = {"group_size": 4, "lr": 1e-3, "clip_range": 0.2, "kl_beta": 0.04}


@pytest.mark.parametrize("name", algorithms.names())
def test_float64_toy_tier_computes_in_float64_except_where_the_contract_says_float32(name):
    """One iteration (two for OP-GRPO: the second replays) of every algorithm on a float64 toy model, with the KL
    on where the algorithm has one, then an evaluation."""
    from flowzoo.models.toy2d import prompt_set

    pairs = prompt_set()
    prompts, metadata = [p for p, _ in pairs], [m for _, m in pairs]
    model = models.get("toy2d")(hidden=32, pretrain_steps=50, dtype="float64")
    config = {} if algorithms.get(name).likelihood_free else TOY_CONFIG
    config = {**config, "group_size": 4}
    iterations = 2 if name.startswith("op_grpo") else 1
    seen = _train_float64(model, rewards.build("toy_mode"), name, config, prompts, metadata, iterations)
    _SEEN["toy"][name] = seen.events
    _check_float64(name, seen)


class Brightness(Reward):
    """A dense test reward: the mean pixel value."""

    name = "brightness"
    accepts = ("image",)

    def score(self, samples, prompts, metadata):
        return RewardOutput(samples.float().mean(dim=(1, 2, 3)))


TINY_ARCH = dict(layers=1, heads=2, head_dim=8, text_width=16, text_layers=1, text_heads=2)
#: the tiny tier at T = 4: windows and truncation that fit
TINY_CONFIG = {"mix_grpo": {"window_size": 2}, "mix_grpo_flash": {"window_size": 2},
               "mix_grpo_flash_star": {"window_size": 2}, "flow_grpo_fast": {"sde_window_size": 1},
               "awm": {"train_timesteps": 2}}


@pytest.mark.parametrize("name", algorithms.names())
def test_float64_tiny_tier_computes_in_float64_except_where_the_contract_says_float32(name):
    """The same on the tiny tier's diffusers transformer and CLIP text encoder (a random float64 model, CFG on)."""
    pytest.importorskip("diffusers")
    model = models.get("tiny")(weights=None, arch=TINY_ARCH, lora_rank=2, lora_alpha=4, dtype="float64")
    config = {"group_size": 2, "num_steps": 4, **TINY_CONFIG.get(name, {})}
    if name.startswith("op_grpo"):
        config["t_off"] = 2
    iterations = 2 if name.startswith("op_grpo") else 1
    prompts = ["a red circle"]
    seen = _train_float64(model, Brightness(), name, config, prompts, [{}], iterations)
    _SEEN["tiny"][name] = seen.events
    _check_float64(name, seen)


def test_float32_by_contract_entries_are_all_met():
    """Every FLOAT32_BY_CONTRACT entry was met by the float64 runs above (an entry that no longer happens must go).
    Needs the toy tier's tests of every algorithm to have run in this session (and the tiny tier's for its entry)."""
    if set(_SEEN["toy"]) != set(algorithms.names()):
        pytest.skip("runs after the toy tier's float64 tests of every algorithm")
    tiers = [tier for tier, runs in _SEEN.items() if set(runs) == set(algorithms.names())]
    met = {(path, function) for tier in tiers for events in _SEEN[tier].values() for path, function, _ in events}
    tiny_only = set() if "tiny" in tiers else {("models/diffusers_common.py", "DiffusersFlowModel._to_unit_range")}
    stale = sorted(set(FLOAT32_BY_CONTRACT) - met - tiny_only)
    assert not stale, f"FLOAT32_BY_CONTRACT entries no float64 run met (remove them): {stale}"


OLD_TOY_PREDICT = '''
def predict(self, x, sigma, cond):
    return self._active(x.float(), sigma.float(), cond.tensors["class"])
'''


def test_a_silent_float32_cast_fails_the_dtype_check(monkeypatch):
    """The toy model's former ``predict`` (``x.float()``: a float64 model computing in float32) is caught, both as an
    unexpected float32 result and by the velocity's dtype."""
    from flowzoo.models.toy2d import Toy2DModel, prompt_set

    namespace: dict = {}
    exec(compile(textwrap.dedent(OLD_TOY_PREDICT), str(ROOT / "models" / "toy2d.py"), "exec"), namespace)
    monkeypatch.setattr(Toy2DModel, "predict", namespace["predict"])
    pairs = prompt_set()
    model = models.get("toy2d")(hidden=32, pretrain_steps=50, dtype="float64")
    seen = _train_float64(model, rewards.build("toy_mode"), "flow_grpo", TOY_CONFIG,
                          [p for p, _ in pairs], [m for _, m in pairs], 1)
    assert ("models/toy2d.py", "predict", "float") in seen.events
    with pytest.raises(AssertionError, match="float32 computed where the contract does not ask for it"):
        _check_float64("flow_grpo", seen)
