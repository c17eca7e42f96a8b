"""What `flowzoo list` prints: every registered algorithm, model, reward, prompt sampler, suite and claim set with a
one-line description, and one entry in full (`flowzoo list NAME`: its parameters with their defaults, as the config
takes them).

Descriptions come from what each class already states (its docstring, else its module's), never from a second list
of names, so a new registration shows up with the text its author wrote.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys

from flowzoo.errors import ConfigError

WIDTH = 100
#: a sentence ends at ". " unless the period closes an abbreviation
_SENTENCE_END = re.compile(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)\.\s")


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= WIDTH else text[: WIDTH - 3].rstrip() + "..."


def summary(obj) -> str:
    """The first sentence of the class's docstring (of its module's when the class defers to it), on one line."""
    for doc in (obj.__doc__, getattr(sys.modules.get(getattr(obj, "__module__", "")), "__doc__", None)):
        text = " ".join((doc or "").strip().split("\n\n")[0].split())
        if text and "module docstring" not in text.lower():
            return _one_line(_SENTENCE_END.split(text, maxsplit=1)[0].rstrip("."))
    return ""


def _sections():
    from flowzoo import algorithms
    from flowzoo import models
    from flowzoo import rewards
    from flowzoo.algorithms import prompt_samplers
    from flowzoo.benchmark.prompts.sources import SOURCE_SUMMARIES, SOURCES
    from flowzoo.benchmark.study import claims as study_claims
    from flowzoo.benchmark.run.suite import load_suite, suite_names

    def algorithm_line(name):
        cls = algorithms.get(name)
        notes = [f"family {cls.family}"]
        if cls.ablation_of:
            notes.append(f"ablation of {cls.ablation_of}")
        return f"{summary(cls)} ({'; '.join(notes)})"

    return (
        ("algorithms", algorithms.names(), algorithm_line),
        ("models", models.names(), lambda name: summary(models.get(name))),
        ("rewards", rewards.names(), lambda name: summary(rewards.get(name))),
        ("prompt samplers", prompt_samplers.names(), lambda name: summary(prompt_samplers.get(name))),
        ("prompt sources", list(SOURCES), lambda name: SOURCE_SUMMARIES[name]),
        ("suites", suite_names(), lambda name: _one_line(load_suite(name).description)),
        ("claim sets", study_claims.names(), lambda name: _one_line(study_claims.claim_set(name).description)),
    )


def overview() -> str:
    lines = []
    for title, names, describe in _sections():
        lines.append(f"{title}:")
        width = max(len(n) for n in names)
        lines += [f"  {name:<{width}}  {describe(name)}" for name in names]
    lines.append("`flowzoo list NAME` shows one entry's parameters with their defaults.")
    return "\n".join(lines)


def _config_defaults(config_cls) -> dict[str, object]:
    return {f.name: (f.default if f.default is not dataclasses.MISSING else
                     f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            for f in dataclasses.fields(config_cls) if f.init}


def _algorithm_params(cls) -> list[tuple[str, object]]:
    defaults = _config_defaults(cls.Config)
    return list({**defaults, **{k: v for k, v in cls.preset.items() if k in defaults}}.items())


def _constructor_params(cls) -> list[tuple[str, object]]:
    params = inspect.signature(cls.__init__).parameters.values()
    return [(p.name, p.default) for p in params
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.default is not inspect.Parameter.empty]


def detail(name: str) -> str:
    """One registered entry in full; ``ConfigError`` naming the known names for anything else."""
    from flowzoo import algorithms
    from flowzoo import models
    from flowzoo import rewards
    from flowzoo.algorithms import prompt_samplers
    from flowzoo.benchmark.study import claims as study_claims
    from flowzoo.benchmark.run.suite import load_suite, suite_names

    if name in algorithms.names():
        cls = algorithms.get(name)
        head = [f"algorithm {name}: {summary(cls)}", f"family: {cls.family}"
                + (f"; ablation of {cls.ablation_of}" if cls.ablation_of else "")
                + (f"; preset {cls.preset}" if cls.preset else ""),
                "parameters (algorithm.<name>, class defaults; a suite's recipe may set others: flowzoo recipes):"]
        params = _algorithm_params(cls)
    elif name in models.names():
        cls = models.get(name)
        head = [f"model {name}: {summary(cls)}", "parameters (model.args.<name>):"]
        params = _constructor_params(cls)
    elif name in rewards.names():
        cls = rewards.get(name)
        head = [f"reward {name}: {summary(cls)}", f"parameters (reward_args.{name}.<name>):"]
        params = _constructor_params(cls)
    elif name in prompt_samplers.names():
        cls = prompt_samplers.get(name)
        head = [f"prompt sampler {name}: {summary(cls)}",
                f"parameters (train.prompt_sampler: {{name: {name}, <name>: ...}}):"]
        params = list(_config_defaults(cls.Config).items())
    elif name in suite_names():
        suite = load_suite(name)
        sets = "; ".join(f"{k}: {v}" for k, v in suite.seed_sets.items()) or f"{suite.seeds}"
        return "\n".join([f"suite {name}: {suite.description}", f"tasks: {', '.join(suite.tasks)}",
                          f"algorithms: {', '.join(suite.algorithms)}", f"seeds: {sets}"]
                         + ([f"tuning: {suite.tuning}"] if suite.tuning else [])
                         + ([f"tuned: {suite.tuned}"] if suite.tuned else []))
    elif name in study_claims.names():
        claims = study_claims.claim_set(name)
        return "\n".join([f"claim set {name}: {claims.description}", f"tasks: {', '.join(claims.tasks)}",
                          f"references: {', '.join(claims.references) or '(the baseline only)'}",
                          f"rules: {claims.source}"])
    else:
        known = [*algorithms.names(), *models.names(), *rewards.names(), *prompt_samplers.names(), *suite_names(),
                 *study_claims.names()]
        raise ConfigError(f"nothing registered as {name!r}; known: {', '.join(known)}")
    lines = head + ([f"  {key} = {value!r}" for key, value in params] or ["  (none)"])
    if name in algorithms.names() or name in prompt_samplers.names():  # what flowzoo tune may change
        from flowzoo.benchmark.config.search_space import listing

        lines += listing(name)
    return "\n".join(lines)


DESCRIPTION = "Each with a one-line description; `flowzoo list NAME` shows one entry's parameters and defaults."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo list``'s argument."""
    parser.add_argument("name", nargs="?", default=None,
                        help="an algorithm, model, reward, prompt sampler, suite or claim set to show in full")


def run(args: argparse.Namespace) -> int:
    """``flowzoo list [NAME]``."""
    if args.name and "=" in args.name:  # list takes no key=value overrides
        args.command_parser.error(f"unrecognized arguments: {args.name}")
    print(detail(args.name) if args.name else overview())
    return 0
