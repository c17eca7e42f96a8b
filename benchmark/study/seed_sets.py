"""A study's seed sets: the designers' named sets (a suite's ``seed_sets``: ``exploration``, the held-out
``replication``), the seeds a user ran outside them, and sets a user names (``--seed-sets unseen=300-309``); and which
two sets "replicated" compares (``--replicate-on``)."""

from __future__ import annotations

import re

from flowzoo.errors import ConfigError

ALL_SEEDS = "all"
OTHER_SEEDS = "other"  # the seeds that ran outside every seed set the suite names
SET_NAME = re.compile(r"[A-Za-z0-9_.-]+")
#: the two seed sets "replicated" compares by default: the designers' and their held-out one
REPLICATION_SETS = ("exploration", "replication")
HELD_OUT = "replication"

def seed_list(seeds) -> str:
    """Sorted seeds with runs of consecutive ones as ranges: [0, 1, 2, 5] -> '0-2, 5'."""
    seeds, parts = sorted(int(seed) for seed in seeds), []
    for seed in seeds:
        if parts and parts[-1][1] == seed - 1:
            parts[-1][1] = seed
        else:
            parts.append([seed, seed])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in parts)

def seed_sets_of(suite: str | None, seeds, chosen: dict[str, list[int] | None] | None = None
                 ) -> dict[str, list[int]]:
    """{name: seeds} restricted to the seeds that ran, plus ``all``: each of the suite's ``seed_sets`` that ran, then
    the seeds that ran outside all of them as ``other`` (a user's own seeds); or, with ``chosen`` ({name: seeds, or
    None for the suite's set of that name}: :func:`parse_seed_sets`), exactly those sets. ConfigError for a name the
    suite lacks, a chosen set none of whose seeds ran, or two chosen sets sharing seeds."""
    ran = sorted(int(s) for s in set(seeds))
    declared: dict[str, list[int]] = {}
    if suite:
        from flowzoo.benchmark.run.suite import load_suite

        declared = load_suite(suite).seed_sets
    sets: dict[str, list[int]] = {}
    if chosen:
        owner: dict[int, str] = {}
        for name, listed in chosen.items():
            if listed is None:
                if name not in declared:
                    known = ", ".join(declared) or "none (give NAME=SEEDS)"
                    raise ConfigError(f"--seed-sets {name}: no such seed set in the suite; its sets: {known}")
                listed = declared[name]
            kept = [s for s in listed if s in ran]
            if not kept:
                raise ConfigError(f"--seed-sets {name}: none of its seeds ({seed_list(listed)}) ran; seeds that "
                                  f"ran: {seed_list(ran)}")
            shared = sorted(s for s in kept if s in owner)
            if shared:
                raise ConfigError(f"--seed-sets {name} shares seeds {seed_list(shared)} with {owner[shared[0]]}; "
                                  "seed sets are disjoint")
            owner.update((s, name) for s in kept)
            sets[name] = kept
        return {**sets, ALL_SEEDS: ran}
    for name, listed in declared.items():
        kept = [s for s in listed if s in ran]
        if kept:
            sets[name] = kept
    listed = {int(s) for seeds_of_set in declared.values() for s in seeds_of_set}
    other = [s for s in ran if s not in listed]
    if declared and other:
        sets[OTHER_SEEDS] = other
    return {**sets, ALL_SEEDS: ran}

def parse_seed_sets(values: list[str] | None) -> dict[str, list[int] | None] | None:
    """``--seed-sets`` values as {name: seeds}: ``NAME=SEEDS`` names a set of its own (``300-309`` or
    ``300,301,305``), any other value is comma-separated names of the suite's sets (None: the suite's seeds)."""
    if not values:
        return None
    sets: dict[str, list[int] | None] = {}
    for value in values:
        items = [value.partition("=")] if "=" in value else [(n.strip(), "", "") for n in value.split(",")]
        for name, _, spec in items:
            if not SET_NAME.fullmatch(name) or name == ALL_SEEDS:
                raise ConfigError(f"--seed-sets {value!r}: {name!r} is not a seed-set name (letters, digits, '_', "
                                  f"'-', '.'; not {ALL_SEEDS!r}); give NAME=SEEDS or the suite's set names")
            if name in sets:
                raise ConfigError(f"--seed-sets {value!r}: set {name!r} is given twice; give each set once")
            sets[name] = _parse_seeds(spec, value) if spec else None
    return sets


#: seeds a ``--seed-sets`` value may name at most (a study's sets are tens of seeds; a typo like 0-1000000000 must not
#: build a billion-element list)
MAX_SET_SEEDS = 10_000

def _parse_seeds(spec: str, value: str) -> list[int]:
    seeds = []
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last) if dash else int(first)
        except ValueError:
            raise ConfigError(f"--seed-sets {value!r}: {part!r} is not a seed or a range a-b") from None
        if high < low:
            raise ConfigError(f"--seed-sets {value!r}: range {part!r} runs backwards")
        if high - low + 1 + len(seeds) > MAX_SET_SEEDS:
            raise ConfigError(f"--seed-sets {value!r}: more than {MAX_SET_SEEDS:,} seeds in one set")
        seeds += range(low, high + 1)
    return sorted(set(seeds))

def replication_pair(seed_sets: dict[str, list[int]], replicate_on: str | None) -> tuple[str, str]:
    """The two sets whose verdicts "replicated" compares: exploration and replication, or with ``replicate_on`` the
    designers' held-out set and that one. ConfigError naming the sets when either has no runs."""
    if replicate_on is None:
        return REPLICATION_SETS
    sets = [name for name in seed_sets if name != ALL_SEEDS]
    if replicate_on not in sets or replicate_on == HELD_OUT:
        raise ConfigError(f"--replicate-on {replicate_on!r}: give a seed set other than {HELD_OUT!r} that ran; "
                          f"sets: {', '.join(sets)}")
    if HELD_OUT not in sets:
        raise ConfigError(f"--replicate-on {replicate_on}: the held-out set {HELD_OUT!r} it is compared with has no "
                          f"runs here (sets: {', '.join(sets)}); run it too, e.g. flowzoo bench SUITE --seed-set "
                          f"{HELD_OUT}")
    return HELD_OUT, replicate_on
