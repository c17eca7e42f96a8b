"""Claim sets: a paper's claims, each with the study's measured figure and a verdict decided by a fixed rule, on every
seed set of the study; the machinery every claim set shares.

A **claim set** (:class:`ClaimSet`) is one paper's claims as rules over the study's run table and paired effects
(:func:`benchmark.study.verdicts.analyze_study`): a function ``claims(table, effects) -> [row, ...]`` whose rows
(:func:`claim_row`) give the claim, its rule, the measured figure and the verdict: **reproduced**, **contradicted**,
**inconclusive** (then the CI width says the smallest effect the study could have seen), or **not tested**. Every
rule is written next to its claim and in the report, before the figure, so the verdict is mechanical; all intervals
are 95% bootstrap CIs over seeds that re-estimate the target in every resample (:mod:`benchmark.analysis.effects`).
Each claim is judged on every seed set of the study apart (the designers' ``exploration`` and held-out
``replication`` seeds, and any set a user names), each with its own target; the row says **replicated** only when
the two sets it compares give the same verdict (:func:`replication`). Each judged claim also carries its figure as
numbers (:func:`estimate`: the ratio or difference, its 95% CI, the paper's value and the verdict zones its rule
draws), which the study page plots (``claim_estimates.csv``).

Each paper's claim sets are one file in :mod:`flowzoo.benchmark.study.claim_sets`, registered on import
(:func:`register`); a suite names its own with its ``claims:`` key, so a renamed copy of the suite keeps it.
:func:`names` lists them (``flowzoo list``), :func:`claim_set` finds one by name. The rule helpers here
(:func:`ratio_claim`, :func:`find_effect`, :func:`paired`, :func:`saving_judge`, ...) are what those files build on;
docs/adding-a-study.md walks through a whole example.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from flowzoo.benchmark.render.tables import markdown_table
from flowzoo.benchmark.study.seed_sets import HELD_OUT, REPLICATION_SETS
from flowzoo.errors import ConfigError
from flowzoo.registry import Registry

#: the claims section's heading (:func:`render_claims`); the page's answer table links to it
CLAIMS_HEADING = "The paper's claims"

#: the cost a steps claim is judged on by default: steps to 80% of the baseline's gain, a target its runs cross
#: decisively (a paper's "reach the baseline's final reward" puts the target on its noisy plateau;
#: benchmark/study/verdicts.py)
STEPS_METRIC = "steps_to_80"
INF = math.inf


def ci_text(low: float, high: float, digits: int = 3) -> str:
    """A CI as ``[low, high]`` (``[-]`` when either end is not finite)."""
    return f"[{low:.{digits}g}, {high:.{digits}g}]" if math.isfinite(low) and math.isfinite(high) else "[-]"


def find_effect(effects: pd.DataFrame, task: str, reference: str, algorithm: str, metric: str) -> pd.Series | None:
    """The effects row of cell ``algorithm`` vs ``reference`` on ``task`` and ``metric``; None when it did not run."""
    hit = effects[(effects["task"] == task) & (effects["reference"] == reference)
                  & (effects["algorithm"] == algorithm) & (effects["metric"] == metric)]
    return None if hit.empty or not hit.iloc[0]["n"] else hit.iloc[0]


def cell_runs(table: pd.DataFrame, task: str, algorithm: str) -> pd.DataFrame:
    """The run-table rows of one cell (``algorithm`` or ``algorithm@variant``) on ``task``, indexed by seed."""
    return table[(table["task"] == task) & (table["algorithm"] == algorithm)].set_index("seed")


def paired(table: pd.DataFrame, task: str, algorithm: str, reference: str, column: str) -> tuple[np.ndarray, float]:
    """(algorithm - reference differences of ``column`` over common seeds, mean of the reference)."""
    a, b = cell_runs(table, task, algorithm), cell_runs(table, task, reference)
    if column not in a or column not in b:
        return np.array([]), math.nan
    seeds = sorted(set(a.index) & set(b.index))
    return (a.loc[seeds, column] - b.loc[seeds, column]).to_numpy(float), float(b.loc[seeds, column].mean())


def claim_row(claim: str, rule: str, measured: str, verdict: str, figure: dict | None = None) -> dict:
    """One judged claim: its text, its rule, the measured figure as text, the verdict and (optionally) the figure as
    numbers (:func:`estimate`)."""
    return {"claim": claim, "rule": rule, "measured": measured, "verdict": verdict, "figure": figure}


def estimate(label: str, kind: str, value: float, low: float, high: float, unit: str = "", paper: float = math.nan,
             reproduced: tuple[float, float] = (math.nan, math.nan),
             contradicted: tuple[float, float] = (math.nan, math.nan)) -> dict:
    """A claim's figure on one seed set as numbers: ``kind`` 'ratio' (drawn on a log axis) or 'difference' (in
    ``unit``), the estimate and its 95% CI, the paper's own value (NaN when the paper gives none) and the verdict
    zones of the rule: a CI inside ``reproduced`` reproduces the claim, one inside ``contradicted`` contradicts it
    (NaN bounds: no such zone; a claim judged by whether its CI covers ``paper`` has none)."""
    return {"label": label, "kind": kind, "unit": unit, "estimate": float(value), "ci_low": float(low),
            "ci_high": float(high), "paper": float(paper), "reproduced_low": float(reproduced[0]),
            "reproduced_high": float(reproduced[1]), "contradicted_low": float(contradicted[0]),
            "contradicted_high": float(contradicted[1])}


def task_tag(task: str) -> str:
    """A task's short name in a figure: its last word (toy2d_sep64_sparse -> sparse)."""
    return task.rsplit("_", 1)[-1]


def ratio_label(algorithm: str, reference: str, metric: str, task: str) -> str:
    """A ratio's label in a figure: ``algorithm / reference: steps (tag)``."""
    unit = metric.partition("_to_")[0]
    return f"{algorithm} / {reference}: {unit.upper() if unit == 'nfe' else unit} ({task_tag(task)})"


def saving_side(low: float, high: float, saving: str) -> str:
    """Which way a steps-ratio CI that missed its claim points: ``saving`` (below 1), no saving, or more steps."""
    return saving if high < 1 else "no saving" if low <= 1 else "needs more steps"


def ratio_claim(effects: pd.DataFrame, task: str, algorithm: str, claim: str, rule: str, judge,
                reference: str = "flow_grpo", metric: str = STEPS_METRIC, also: str | None = None,
                paper: float = math.nan, reproduced=(math.nan, math.nan),
                contradicted=(math.nan, math.nan)) -> dict:
    """A claim on ``algorithm`` / ``reference`` cost to 80% of the gain (steps, or ``metric``): ``judge(low, high)``
    of the ratio's CI gives the verdict; no runs or no CI are 'not tested' / 'inconclusive (no CI)'. ``also``: a
    second metric whose ratio the measured text shows beside it (e.g. NFE next to steps). ``paper``, ``reproduced``,
    ``contradicted``: the figure's marks (:func:`estimate`), which must say what ``judge`` decides."""
    e = find_effect(effects, task, reference, algorithm, metric)
    if e is None:
        return claim_row(claim, rule, "no runs", "not tested")
    label = ratio_label(algorithm, reference, metric, task)
    if not math.isfinite(float(e["target"])):  # every run censored at the budget: a ratio of 1 that compares nothing
        empty = estimate(label, "ratio", math.nan, math.nan, math.nan, paper=paper, reproduced=reproduced,
                         contradicted=contradicted)  # drawn as its zones and its verdict
        return claim_row(claim, rule, "no target: Flow-GRPO's mean final reward does not exceed the base model's in "
                         "these seeds", "not tested (no target)", empty)
    unit = metric.split("_")[0]
    measured = (f"ratio {e['ratio']:.2f} {ci_text(e['ratio_low'], e['ratio_high'])} ({e['algorithm_mean']:.0f} vs "
                f"{e['reference_mean']:.0f} {unit}, reached {int(e['reached'])}/{int(e['n'])} vs "
                f"{int(e['reference_reached'])}/{int(e['n'])})")
    other = find_effect(effects, task, reference, algorithm, also) if also else None
    if other is not None:
        measured += (f"; {also.split('_')[0]} ratio {other['ratio']:.2f} "
                     f"{ci_text(other['ratio_low'], other['ratio_high'])}")
    figure = estimate(label, "ratio", e["ratio"], e["ratio_low"],
                      e["ratio_high"], paper=paper, reproduced=reproduced, contradicted=contradicted)
    if not (math.isfinite(e["ratio_low"]) and math.isfinite(e["ratio_high"])):
        return claim_row(claim, rule, measured, "inconclusive (no CI)", figure)
    return claim_row(claim, rule, measured, judge(float(e["ratio_low"]), float(e["ratio_high"])), figure)


def saving_judge(low: float, high: float) -> str:
    """A ratio claimed below 1: reproduced if its CI lies below 1, contradicted if it lies at or above 1."""
    if high < 1:
        return "reproduced"
    if low > 1:
        return "contradicted (costs more)"
    return "contradicted (no saving)" if low == 1 else "inconclusive"


#: the zones of :func:`saving_judge` (a CI exactly at 1 from below is "no saving": contradicted)
SAVING_ZONES = {"reproduced": (0, 1), "contradicted": (1, INF)}


@dataclass(frozen=True)
class ClaimSet:
    """One paper's claims with what they read. ``claims(table, effects)`` gives one :func:`claim_row` per claim, in
    the same order on every seed set. ``tasks``: the tasks its claims read; the first is how runs of a suite that
    names no claim set are matched to one (:func:`match_claim_set`). ``references``: the cells besides the baseline
    its claims pair others with (the study adds those that ran to its references). ``description``: one line for
    ``flowzoo list``. ``note``: a sentence the report shows under the claims' heading."""

    name: str
    claims: Callable[[pd.DataFrame, pd.DataFrame], list[dict]]
    tasks: tuple[str, ...]
    references: tuple[str, ...] = ()
    description: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "references", tuple(self.references))
        if not self.tasks:
            raise ValueError(f"claim set {self.name!r} names no task; give the tasks its claims read")
        if not callable(self.claims):
            raise ValueError(f"claim set {self.name!r}: claims must be a function (table, effects) -> rows")

    @property
    def source(self) -> str:
        """The file its rules are written in, relative to the project when inside it (else its name; the rules'
        module when there is no file)."""
        try:
            found = inspect.getsourcefile(self.claims)
        except TypeError:  # not a plain function (a partial, a callable object)
            found = None
        if not found:
            return str(getattr(self.claims, "__module__", None) or self.name)
        path = Path(found).resolve()
        return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


ROOT = Path(__file__).resolve().parents[2]
#: every claim set by name; each file of :mod:`flowzoo.benchmark.study.claim_sets` registers its own on import
REGISTRY: Registry[ClaimSet] = Registry("claim set")
#: ``--claims none``: judge no claim set; ``auto`` is the study's default (the suite's own); neither names a set
NO_CLAIMS = "none"
CLAIMS_AUTO = "auto"


def register(claims: ClaimSet) -> ClaimSet:
    """Register ``claims`` under its name (a second set of the same name is refused); returns it."""
    if claims.name in (NO_CLAIMS, CLAIMS_AUTO) or not claims.name.strip():
        raise ValueError(f"{claims.name!r} cannot name a claim set: `--claims {NO_CLAIMS}` and `{CLAIMS_AUTO}` mean "
                         "no set and the suite's own")
    REGISTRY.add(claims.name, claims)
    return claims


def _load() -> None:
    """Import every registered claim set's file (the package imports each module in its folder)."""
    import flowzoo.benchmark.study.claim_sets  # noqa: F401


def names() -> list[str]:
    """The registered claim sets' names, sorted."""
    _load()
    return REGISTRY.names()


def claim_sets() -> list[ClaimSet]:
    """Every registered claim set, by name."""
    return [REGISTRY.get(name) for name in names()]


def claim_set(name: str, option: str = "--claims") -> ClaimSet:
    """The claim set called ``name``; ConfigError naming the valid ones."""
    _load()
    if name not in REGISTRY:
        raise ConfigError(f"{option} {name!r}: no such claim set; claim sets: {', '.join(REGISTRY.names())} (or "
                          f"{NO_CLAIMS})")
    return REGISTRY.get(name)


def match_claim_set(tasks) -> ClaimSet | None:
    """The claim set whose first task ran (runs of a suite that names none); None when no claim set's or several
    sets' do."""
    tasks = set(tasks)
    found = [cs for cs in claim_sets() if cs.tasks[0] in tasks]
    return found[0] if len(found) == 1 else None


def _rules(claims) -> Callable[[pd.DataFrame, pd.DataFrame], list[dict]]:
    """A claim set's rules from a :class:`ClaimSet`, its name, or the function itself."""
    if isinstance(claims, str):
        claims = claim_set(claims)
    return claims.claims if isinstance(claims, ClaimSet) else claims


def replication(verdicts: list[str], names: list[str] | None = None) -> str:
    """'replicated: V' when every seed set's verdict has the same first word V; 'not tested' when no set was tested;
    'held-out only: V' when the held-out set (named ``HELD_OUT`` in ``names``) is the only one tested (the other's runs
    did not log the claim's measure, or gave no target: a verdict on seeds nobody designed on, with nothing to
    replicate it); else 'not replicated'."""
    names = names or [""] * len(verdicts)
    tested = [(name, v.split(" ")[0]) for name, v in zip(names, verdicts) if v.split(" ")[0] != "not"]
    if not tested:
        return "not tested"
    if len(tested) < len(verdicts):
        return f"held-out only: {tested[0][1]}" if [name for name, _ in tested] == [HELD_OUT] else "not replicated"
    heads = {head for _, head in tested}
    return f"replicated: {heads.pop()}" if len(heads) == 1 else "not replicated"


def judge(table: pd.DataFrame, effects: pd.DataFrame, seed_sets: dict[str, list[int]] | None,
          claims: ClaimSet | str | Callable,
          pair: tuple[str, str] = REPLICATION_SETS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the claims table, the figures' table) of ``claims`` (a :class:`ClaimSet`, its name, or its rules). Claims:
    one row per claim, with claim, rule, and per seed set ``measured <set>`` and ``verdict <set>``; when both sets of
    ``pair`` were judged, ``replication`` says whether their verdicts agree. Without seed sets (an effects table of
    one set) the columns are ``measured`` and ``verdict``. Figures: one row per (claim, seed set) with a figure
    (:func:`estimate`), its verdict beside it."""
    claims = _rules(claims)
    if "seed_set" not in effects or not seed_sets:
        per_set = {"all": claims(table, effects)}
        flat = pd.DataFrame([{k: v for k, v in row.items() if k != "figure"} for row in per_set["all"]])
        return flat, _figures(per_set)
    judged = [name for name in seed_sets if name in set(effects["seed_set"])]
    per_set = {}
    for name in judged:
        seeds = set(seed_sets[name])
        per_set[name] = claims(table[table["seed"].isin(seeds)], effects[effects["seed_set"] == name])
    rows = []
    for i, first in enumerate(per_set[judged[0]]):
        row = {"claim": first["claim"], "rule": first["rule"]}
        for name in judged:
            row[f"measured {name}"], row[f"verdict {name}"] = per_set[name][i]["measured"], per_set[name][i]["verdict"]
        if all(name in per_set for name in pair):
            row["replication"] = replication([per_set[name][i]["verdict"] for name in pair], list(pair))
        rows.append(row)
    return pd.DataFrame(rows), _figures(per_set)


FIGURE_COLUMNS = ("claim", "seed_set", "verdict", "label", "kind", "unit", "estimate", "ci_low", "ci_high", "paper",
                  "reproduced_low", "reproduced_high", "contradicted_low", "contradicted_high")


def _figures(per_set: dict[str, list[dict]]) -> pd.DataFrame:
    rows = [{"claim": row["claim"], "seed_set": name, "verdict": row["verdict"], **row["figure"]}
            for name, claims in per_set.items() for row in claims if row.get("figure")]
    return pd.DataFrame(rows, columns=list(FIGURE_COLUMNS))


def claims_table(table: pd.DataFrame, effects: pd.DataFrame, seed_sets: dict[str, list[int]] | None,
                 claims: ClaimSet | str | Callable, pair: tuple[str, str] = REPLICATION_SETS) -> pd.DataFrame:
    """The claims table of :func:`judge`."""
    return judge(table, effects, seed_sets, claims, pair)[0]


def shown_sets(claims: pd.DataFrame) -> list[str]:
    """The seed sets a claims table shows: every judged set but ``all``, or ``all`` when it is the only one."""
    sets = [c[len("verdict "):] for c in claims.columns if c.startswith("verdict ")]
    return [s for s in sets if s != "all"] or sets


def render_claims(claims: pd.DataFrame, pair: tuple[str, str] = REPLICATION_SETS,
                  claims_of: ClaimSet | None = None) -> list[str]:
    """The report's claims section: the table of :func:`judge`, under a line naming the file of ``claims_of``'s
    rules and its ``note``."""
    sets = [c[len("verdict "):] for c in claims.columns if c.startswith("verdict ")]
    agree = ("exploration and the held-out replication seeds agree" if tuple(pair) == REPLICATION_SETS
             else f"seed sets `{pair[0]}` and `{pair[1]}` agree")
    source = f"`{claims_of.source}`" if claims_of else "its claim set"
    note = f" {claims_of.note}" if claims_of and claims_of.note else ""
    lines = [f"## {CLAIMS_HEADING}", "",
             f"Each verdict follows the rule in its row, applied mechanically by {source} on each seed set apart (each "
             f"with its own target from its own baseline runs); **replicated** only when the {agree}; **held-out only** "
             f"when only the held-out seeds could be judged (the other set's runs did not log the claim's measure, or "
             f"gave no target).{note}", ""]
    if not sets:
        rows = [[row["claim"], row["rule"], row["measured"], f"**{row['verdict']}**"] for _, row in claims.iterrows()]
        return lines + markdown_table(["claim", "rule", "measured (95% CI)", "verdict"], rows) + [""]
    shown = shown_sets(claims)
    replicated = "replication" in claims
    headers = ["claim", "rule", *(f"{s}: {what}" for s in shown for what in ("measured (95% CI)", "verdict")),
               *(["replication"] if replicated else [])]
    rows = [[row["claim"], row["rule"], *(row[f"{what} {s}"] for s in shown for what in ("measured", "verdict")),
             *([f"**{row['replication']}**"] if replicated else [])] for _, row in claims.iterrows()]
    return lines + markdown_table(headers, rows) + [""]
