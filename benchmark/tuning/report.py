"""The results of ``flowzoo tune`` as data: per (task, algorithm) the trial table and the chosen configuration, per
task a sensitivity figure, and the chosen-configurations table.

``OUT/trials/<task>/<algorithm>.csv``   every counted trial: number, state, objective, seconds, its values
``OUT/tuned/<task>/<algorithm>.yaml``   the best complete trial's values (a suite's ``tuned: OUT/tuned`` reads them)
``OUT/figures/sensitivity_<task>.png``  objective against each knob, one row of panels per algorithm, pruned hollow
``OUT/chosen.csv``, ``OUT/index.md``     the chosen configurations with each cell's budget as spent

Every file is written atomically; the same storage gives the same files (no dates).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from flowzoo.benchmark.render import figures
from flowzoo.benchmark.render.tables import markdown_table
from flowzoo.benchmark.config.search_space import Knob
from flowzoo.benchmark.tuning.confirm import Verdict, stored_rows, verdict
from flowzoo.benchmark.tuning.tune import Cell, check_design, open_storage, shown_url
from flowzoo.benchmark.config.tuning_design import TuningDesign
from flowzoo.benchmark.config.tuned import tuned_path
from flowzoo.errors import ConfigError
from flowzoo.io import atomic_write, atomic_write_text, staged_directory

COUNTED = ("COMPLETE", "PRUNED")


def trial_table(study) -> pd.DataFrame:
    """The study's counted trials (complete and pruned; failed ones were re-run or given way to another)."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        if trial.state.name not in COUNTED:
            continue
        seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else None
        rows.append({"trial": trial.number, "state": trial.state.name.lower(), "objective": trial.value,
                     "seconds": seconds, "cpu_s": trial.user_attrs.get("cpu_s"),
                     "evaluations": len(trial.intermediate_values),
                     "stopped": trial.user_attrs.get("stopped", ""),
                     **{f"param_{k}": v for k, v in trial.params.items()}})
    return pd.DataFrame(rows)


def chosen(table: pd.DataFrame) -> pd.Series | None:
    """The best complete trial (the lowest number among equals), or None when none is complete."""
    complete = table[table["state"] == "complete"] if len(table) else table
    if not len(complete):
        return None
    return complete.sort_values(["objective", "trial"], ascending=[False, True]).iloc[0]


def tuned_record(suite_name: str, design: TuningDesign, cell: Cell, table: pd.DataFrame, best: pd.Series,
                 budget: int) -> dict:
    params = {c.removeprefix("param_"): _plain(best[c]) for c in table.columns if c.startswith("param_")}
    return {
        "suite": suite_name, "task": cell.task, "algorithm": cell.algorithm,
        "objective": design.objective, "value": float(best["objective"]), "trial": int(best["trial"]),
        "budget": {"trials": budget, "complete": int((table["state"] == "complete").sum()),
                   "pruned": int((table["state"] == "pruned").sum())},
        "seeds": list(design.seeds), "steps": design.steps,
        "validation": {"eval_seed": design.validation.eval_seed, "prompts": design.validation.prompts},
        "algorithm_keys": {k: v for k, v in params.items() if not k.startswith("sampler.")},
        "sampler_keys": {k.removeprefix("sampler."): v for k, v in params.items() if k.startswith("sampler.")},
    }


def shared_record(suite_name: str, design: TuningDesign, cell: Cell, table: pd.DataFrame, budget: int) -> dict:
    """A tuned file that keeps the shared recipe: the confirmation found no tuned candidate better than it."""
    return {"suite": suite_name, "task": cell.task, "algorithm": cell.algorithm, "objective": design.objective,
            "kept_shared": True,
            "budget": {"trials": budget, "complete": int((table["state"] == "complete").sum()),
                       "pruned": int((table["state"] == "pruned").sum())},
            "seeds": list(design.seeds), "steps": design.steps,
            "validation": {"eval_seed": design.validation.eval_seed, "prompts": design.validation.prompts},
            "algorithm_keys": {}, "sampler_keys": {}}


def confirmation_record(design: TuningDesign, confirmed: Verdict) -> dict:
    """What a tuned file records of its confirmation."""
    mean, low, high = confirmed.difference
    return {"seeds": list(design.confirmation.seeds), "pick": confirmed.pick,
            "means": {row["candidate"]: round(float(row["mean"]), 6) for _, row in confirmed.table.iterrows()},
            "best_tuned_minus_shared": None if math.isnan(mean) else
            {"mean": round(mean, 6), "ci": [round(low, 6), round(high, 6)]}}


def _chosen_text(design: TuningDesign, table: pd.DataFrame, best, confirmed: Verdict | None) -> str:
    if design.confirmation is not None and confirmed is None:
        return "not confirmed yet: rerun flowzoo tune"
    if confirmed is not None and confirmed.keeps_shared:
        return "the shared recipe (kept: no tuned candidate beat it on the confirmation seeds)"
    if best is None:
        return ""
    values = ", ".join(f"{c.removeprefix('param_')}={_short(best[c])}" for c in table.columns if c.startswith("param_"))
    return values if design.confirmation is not None else f"{values} (unconfirmed: the best on the tuning seeds)"


def answer_lines(design: TuningDesign, summary: list[dict], confirmations: list) -> list[str]:
    """The page's answer, under its title: per cell the recipe its runs take and, with a confirmation stage, the best
    tuned candidate's difference to the shared recipe on the confirmation seeds (paired by seed, 95% CI)."""
    confirmed = {(cell.task, cell.algorithm): verdict for cell, verdict in confirmations}
    if design.confirmation is None:
        lines = ["**The answer**: each cell's recipe, the best trial on the tuning seeds (unconfirmed: an estimate "
                 "biased upward by the choice).", ""]
        rows = [[row["task"], row["algorithm"],
                 "-" if row["best_trial"] is None else f"trial {row['best_trial']}: {row['chosen']}",
                 "-" if row["objective"] is None else f"{row['objective']:.4f}"] for row in summary]
        return lines + markdown_table(["task", "algorithm", "runs at", "objective (tuning seeds)"], rows) + [""]
    lines = [f"**The answer**: the recipe each cell runs at, and what tuning bought: the best tuned candidate minus the "
             f"shared recipe on the confirmation seeds {list(design.confirmation.seeds)} (paired by seed, 95% "
             "bootstrap CI). A cell whose tuned candidates do not beat the shared recipe keeps it.", ""]
    rows = []
    for row in summary:
        verdict = confirmed.get((row["task"], row["algorithm"]))
        if verdict is None or verdict.best_tuned is None:
            at, gain = ("not finished: rerun flowzoo tune" if verdict is None else "the shared recipe"), "-"
        else:
            mean, low, high = verdict.difference
            gain = f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]" + (f" ({verdict.best_tuned})" if verdict.keeps_shared else "")
            at = ("the shared recipe (kept)" if verdict.keeps_shared
                  else f"{verdict.pick.replace('trial', 'trial ')}: {row['chosen']}")
        rows.append([row["task"], row["algorithm"], at, gain])
    return lines + markdown_table(["task", "algorithm", "runs at", "best tuned - shared (95% CI)"], rows) + [""]


def confirmation_lines(design: TuningDesign, confirmations: list) -> list[str]:
    """The page's confirmation section: per cell, each candidate on the confirmation seeds, the pick, the spread."""
    if design.confirmation is None:
        return ["", "No confirmation stage in this design: each pick is the best trial on the tuning seeds, an "
                    "estimate biased upward by the choice (docs/tuning.md)."]
    lines = ["", "## Confirmation", "",
             f"The shared recipe and the {design.confirmation.top_k} best trials of each cell, re-run on confirmation "
             f"seeds {list(design.confirmation.seeds)} (never used to tune, explore or replicate) on the validation "
             f"split; the pick is the highest mean there, and a cell whose best tuned candidate does not beat its "
             f"shared recipe keeps it. Means with 95% bootstrap intervals over the seeds; sd: the objective's spread "
             f"between seeds at that recipe (noise a tuning seed's score carries).", ""]
    rows = [[cell.task, cell.algorithm, row["candidate"], f"{row['mean']:.4f}",
             f"[{row['ci_low']:.4f}, {row['ci_high']:.4f}]", f"{row['sd']:.4f}", f"{row['cpu_s'] / 60:.1f}",
             "**pick**" if row["candidate"] == confirmed.pick else ""]
            for cell, confirmed in confirmations for _, row in confirmed.table.iterrows()]
    lines += markdown_table(["task", "algorithm", "candidate", "mean", "95% CI", "sd", "CPU-min", "pick"], rows) + [""]
    lines += [f"- {cell.task}/{cell.algorithm}: {confirmed.sentence()}" for cell, confirmed in confirmations]
    return lines


def _plain(value):
    """A numpy scalar as a plain Python value (YAML-safe)."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if math.isnan(value) else float(value)
    return value


TITLE_CHARS_PER_INCH = 11  # characters of the default title font per inch of figure
TITLE_LINE_INCHES = 0.22


@figures.themed
def plot_sensitivity(task: str, cells: list[Cell], tables: dict[str, pd.DataFrame], stem: Path) -> list[Path]:
    """Objective against each knob: one row of panels per algorithm, complete trials filled, pruned hollow."""
    plt = figures.pyplot()
    columns = max(len(c.all_knobs()) for c in cells)
    width, height = figures.PANEL_SIZE
    fig, axes = plt.subplots(len(cells), columns, figsize=(width * columns, height * len(cells)), squeeze=False)
    for row, cell in enumerate(cells):
        table = tables[cell.algorithm]
        for col in range(columns):
            ax = axes[row][col]
            knobs = list(cell.all_knobs().items())
            if col >= len(knobs) or not len(table):
                ax.axis("off")
                continue
            name, knob = knobs[col]
            _draw_knob(ax, table, name, knob)
            ax.set_title(f"{cell.algorithm}: {name}")
            ax.set_ylabel("objective" if col == 0 else "")
    # wrapped to the figure's width (one knob per cell, e.g. lr alone, gives a one-panel-wide figure) and room kept
    # above the panels for it
    title = textwrap.wrap(f"{task}: objective per trial (filled: complete, hollow: pruned at its last evaluation)",
                          width=max(20, int(TITLE_CHARS_PER_INCH * width * columns)))
    fig.suptitle("\n".join(title))
    fig.tight_layout(rect=(0, 0, 1, 1 - TITLE_LINE_INCHES * len(title) / (height * len(cells))))
    return figures.save_figure(fig, stem)


def _draw_knob(ax, table: pd.DataFrame, name: str, knob: Knob) -> None:
    x = table[f"param_{name}"]
    if knob.type == "categorical":
        labels = [str(c) for c in knob.choices]
        x = x.map(lambda v: labels.index(str(v)))
        ax.set_xticks(range(len(labels)), labels)
    elif knob.log:
        ax.set_xscale("log")
    for state, face in (("complete", "C0"), ("pruned", "none")):
        part = table["state"] == state
        ax.scatter(x[part], table.loc[part, "objective"], facecolors=face, edgecolors="C0", s=22, label=state)


def write_tuning_report(suite_name: str, design: TuningDesign, cells: list[Cell], storage_url: str | None, out: Path,
                        budget: int, from_trials: Path | None = None) -> Path:
    """Every output of the tuning (module docstring) from the storage, or with ``from_trials`` from the trial tables
    an earlier report wrote (``from_trials/trials``: a committed report whose storage is gone); returns
    ``out/index.md``. The folder is written all or nothing (``staged_directory``: a full disk leaves no half-written
    report; an existing ``out`` keeps its other files)."""
    if from_trials is not None:
        records = _records_from_tables(Path(from_trials) / "trials")
        check_source_holds(cells, suite_name, f"--from-trials {from_trials}: {Path(from_trials) / 'trials'}",
                           "table", _tables_held(Path(from_trials) / "trials"), "an earlier report of the suite")
        read = {cell.study_name: records(cell) for cell in cells}  # a damaged table refuses before anything is written
        records = lambda cell: read[cell.study_name]  # noqa: E731
    else:
        storage = open_storage(storage_url)
        records = _records_from_storage(storage, suite_name)
        check_source_holds(cells, suite_name, f"--report: {shown_url(storage_url)}", "study",
                           _studies_held(storage), "the storage the suite was tuned in", prefix=f"{suite_name}/")
        check_designs(storage, suite_name, design, cells)
    with staged_directory(out) as stage:
        _write_outputs(suite_name, design, cells, records, stage, budget)
        written = [(cell, tuned_path(stage / "tuned", cell.task, cell.algorithm).is_file()) for cell in cells]
    for cell, fresh in written:  # a cell of this report without a pick now keeps no pick of an older report
        stale = tuned_path(Path(out) / "tuned", cell.task, cell.algorithm)
        if not fresh and stale.is_file():
            stale.unlink()
            print(f"tuning report: removed {stale}, an older report's pick: {cell.study_name} has none now")
    return Path(out) / "index.md"


EMPTY_COLUMNS = ["trial", "state", "objective"]


def check_source_holds(cells: list[Cell], suite_name: str, source: str, kind: str, held: list[str], wanted: str,
                       prefix: str = "") -> None:
    """A one-line ConfigError, before anything is written, when the report's source (a storage or an earlier
    report's trial tables) holds nothing of the report's cells: another suite's storage or tables would otherwise
    write every cell as untried and remove the report's tuned picks."""
    names = [f"{prefix}{cell.study_name}" for cell in cells]
    if any(name in held for name in names):
        return
    holds = f"it holds {', '.join(held[:5])}{' ...' if len(held) > 5 else ''}" if held else f"it holds no {kind}"
    raise ConfigError(f"{source} holds no {kind} of suite {suite_name}'s cells "
                      f"({', '.join(cell.study_name for cell in cells)}); {holds}; nothing was written: give {wanted}")


def _studies_held(storage) -> list[str]:
    import optuna

    return sorted(optuna.get_all_study_names(storage))


def _tables_held(trials: Path) -> list[str]:
    """The cells ``task/algorithm`` an earlier report's ``trials/`` holds a table of (an empty file is none)."""
    if not trials.is_dir():
        return []
    return sorted(f"{p.parent.name}/{p.stem}" for p in trials.glob("*/*.csv")
                  if not p.name.endswith(".confirmation.csv") and p.stat().st_size)


def _records_from_storage(storage, suite_name: str):
    """A cell's trial table and confirmation rows (None without) from the Optuna storage."""
    import optuna

    def records(cell: Cell) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        try:
            study = optuna.load_study(study_name=f"{suite_name}/{cell.study_name}", storage=storage)
        except KeyError:  # no trial ran yet
            return pd.DataFrame(columns=EMPTY_COLUMNS), None
        table = trial_table(study)
        return table, (stored_rows(study) if len(table) else None)

    return records


def check_designs(storage, suite_name: str, design: TuningDesign, cells: list[Cell]) -> None:
    """A one-line ConfigError, before anything is written, when a cell's study was tuned under another design than
    the report's (other tuning seeds, steps or space): the report refuses it as `tune` refuses to resume it, rather
    than write its trials as this design's."""
    import optuna

    held = set(optuna.get_all_study_names(storage))
    for cell in cells:
        name = f"{suite_name}/{cell.study_name}"
        if name in held:
            check_design(optuna.load_study(study_name=name, storage=storage), design, cell)


def _records_from_tables(trials: Path):
    """A cell's trial table and confirmation rows from an earlier report's ``trials/`` (the files this module
    writes: ``<task>/<algorithm>.csv`` and ``<task>/<algorithm>.confirmation.csv``)."""
    if not trials.is_dir():
        raise ConfigError(f"--from-trials: no trial tables in {trials} (an earlier `flowzoo tune --out` writes them)")

    def records(cell: Cell) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        csv = trials / cell.task / f"{cell.algorithm}.csv"
        if not csv.is_file() or not csv.stat().st_size:
            return pd.DataFrame(columns=EMPTY_COLUMNS), None
        table = _read_table(csv, {"trial": "integer", "state": "state", "objective": "number"}).fillna({"stopped": ""})
        confirmation = csv.with_name(f"{cell.algorithm}.confirmation.csv")
        rows = None
        if confirmation.is_file():
            rows = _read_table(confirmation, {"candidate": "text", "trial": "any", "seed": "integer",
                                              "objective": "number", "values": "any", "cpu_s": "any"},
                               dtype={"values": str, "candidate": str})
        return table, rows

    return records


def _read_table(csv: Path, needed: dict[str, str], **options) -> pd.DataFrame:
    """A hand-editable trial or confirmation table, or a one-line ConfigError naming the file and what is wrong: not
    a CSV (binary, damaged), a needed column missing, or a value not of its column's kind."""
    try:
        table = pd.read_csv(csv, **options)
    except (ValueError, UnicodeDecodeError, OSError) as error:  # pandas' ParserError / EmptyDataError are ValueErrors
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(f"--from-trials: cannot read {csv} as a trial table ({first})") from None
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ConfigError(f"--from-trials: {csv} has no column {', '.join(missing)} (it has "
                          f"{', '.join(map(str, table.columns)) or 'none'}); a table `flowzoo tune --out` wrote has "
                          f"{', '.join(needed)}")
    for column, kind in needed.items():
        values = table[column]
        if kind == "number":
            bad = pd.to_numeric(values, errors="coerce").isna() & values.notna()
        elif kind == "integer":
            numbers = pd.to_numeric(values, errors="coerce")
            bad = numbers.isna() | (numbers != numbers.round())
        elif kind == "state":
            bad = ~values.isin([s.lower() for s in COUNTED])
        elif kind == "text":
            bad = values.isna()
        else:
            continue
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            want = {"number": "a number", "integer": "an integer", "text": "a value",
                    "state": " or ".join(s.lower() for s in COUNTED)}[kind]
            raise ConfigError(f"--from-trials: {csv} row {row + 1}: {column} is {values.iloc[row]!r}, not {want}")
        if kind in ("number", "integer"):
            table[column] = pd.to_numeric(values)
    return table


def _write_outputs(suite_name: str, design: TuningDesign, cells: list[Cell], records, out: Path, budget: int) -> None:
    summary, by_task, confirmations = [], {}, []
    for cell in cells:
        table, rows = records(cell)
        by_task.setdefault(cell.task, []).append((cell, table))
        csv = out / "trials" / cell.task / f"{cell.algorithm}.csv"
        atomic_write(csv, lambda f, t=table: t.to_csv(f, index=False))
        best = chosen(table)
        spent = int(len(table))
        confirmed = None
        if design.confirmation is not None:
            confirmed = None if rows is None else verdict(rows)
            best = None if confirmed is None or confirmed.keeps_shared else table[
                table["trial"] == int(confirmed.pick.removeprefix("trial"))].iloc[0]
            if rows is not None:
                atomic_write(out / "trials" / cell.task / f"{cell.algorithm}.confirmation.csv",
                             lambda f, r=rows: r.to_csv(f, index=False))
                confirmations.append((cell, confirmed))
        if best is not None or (confirmed is not None and confirmed.keeps_shared):
            record = (tuned_record(suite_name, design, cell, table, best, budget) if best is not None
                      else shared_record(suite_name, design, cell, table, budget))
            if confirmed is not None:
                record["confirmation"] = confirmation_record(design, confirmed)
            atomic_write_text(tuned_path(out / "tuned", cell.task, cell.algorithm),
                              f"# chosen by flowzoo tune {suite_name} (docs/tuning.md)\n"
                              + yaml.safe_dump(record, sort_keys=False))
        cpu = pd.to_numeric(table["cpu_s"], errors="coerce").sum() if spent and "cpu_s" in table else 0.0
        summary.append({"task": cell.task, "algorithm": cell.algorithm, "trials": f"{spent}/{budget}",
                        "knobs": len(cell.all_knobs()), "left_out": ", ".join(cell.inert), "cpu_min": cpu / 60,
                        "complete": int((table["state"] == "complete").sum()) if spent else 0,
                        "pruned": int((table["state"] == "pruned").sum()) if spent else 0,
                        "best_trial": None if best is None else int(best["trial"]),
                        "objective": None if best is None else float(best["objective"]),
                        "chosen": _chosen_text(design, table, best, confirmed)})
    frame = pd.DataFrame(summary)
    atomic_write(out / "chosen.csv", lambda f: frame.to_csv(f, index=False))
    figure_lines = []
    for task, pairs in by_task.items():
        stem = out / "figures" / f"sensitivity_{task.replace('@', '_at_')}"
        if any(len(t) for _, t in pairs):
            plot_sensitivity(task, [c for c, _ in pairs], {c.algorithm: t for c, t in pairs}, stem)
            figure_lines.append(f"![{task}](figures/{stem.name}.png)")
    lines = [f"# Tuning of {suite_name}", "", *answer_lines(design, summary, confirmations),
             f"Objective `{design.objective}` over tuning seeds {list(design.seeds)}, {design.steps or 'the suite'}'s "
             f"steps; {budget} trials per cell (complete + pruned), TPE (seed {design.sampler.seed}), "
             f"{design.pruner.name} pruner. A cell whose trials are short of {budget} is not finished: rerun "
             f"`flowzoo tune {suite_name}`. Trials score on a validation split: evaluation noise seed "
             f"{design.validation.eval_seed} (the reported runs' is their train.eval_seed) and "
             f"{'prompts held out from the reported evaluation set' if design.validation.prompts == 'held_out' else 'the reported prompts (the task has none to hold out)'}.",
             "",
             "The budget is equal in trials; `knobs` is the size of each cell's space and `CPU-min` the compute its "
             "trials spent (pruning and extra sampler rounds make it differ); `left out` names the knobs of the "
             "declared space that cannot change the cell's runs (inert at its keys, e.g. a KL weight at kl_beta 0), "
             "which are never tuned.", ""]
    lines += markdown_table(
        ["task", "algorithm", "knobs", "left out", "trials", "complete", "pruned", "CPU-min", "best trial", "objective",
         "chosen"],
        [[row["task"], row["algorithm"], row["knobs"], row["left_out"] or "-", row["trials"], row["complete"],
          row["pruned"], f"{row['cpu_min']:.1f}", "-" if row["best_trial"] is None else row["best_trial"],
          "-" if row["objective"] is None else f"{row['objective']:.4f}", row["chosen"]] for row in summary])
    lines += confirmation_lines(design, confirmations)
    lines += ["", "Chosen configurations: `tuned/<task>/<algorithm>.yaml` (a suite's `tuned:` key names `tuned/`); "
              "trial tables: `trials/`.", "", *figure_lines]
    atomic_write_text(out / "index.md", "\n".join(lines) + "\n")


def _short(value) -> str:
    value = _plain(value)
    return f"{value:.3g}" if isinstance(value, float) else str(value)
