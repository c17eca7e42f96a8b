"""Every citation of released code in the recipe files names a file, a commit and lines that exist.

A citation is a `file.py` or `file.sh` token in a comment of ``benchmark/recipes/*.yaml`` (and of the paper
suites, ``benchmark/suites/paper-*.yaml``), optionally with lines
(`:12`, `:12-20,31`) and a commit (`at abc1234`). It must resolve, through the file's short names or its full path, to
an entry of ``benchmark/released_files.yaml`` (the index of the released files read: repository, path, commit, line
count), and every cited line must lie within that file. The index is typed from the released code; this test cannot
say that a line holds what the comment claims, but a wrong path, commit or line number fails.
"""

import re
from pathlib import Path

import pytest
import yaml

from flowzoo.benchmark.config import recipes

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "benchmark" / "released_files.yaml"
# a file token (not part of a longer path or name), its optional lines and its optional commit
CITATION = re.compile(
    r"(?<![\w/.*+-])(?P<file>[\w./*+-]+\.(?:py|sh))(?::(?P<lines>\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*))?"
    r"(?: at (?P<commit>[0-9a-f]{7,40}))?"
)


def load_index(path: Path = INDEX) -> tuple[list[dict], dict[str, dict[str, dict]]]:
    """The index's files, and per hyperparameter file its short names resolved to those files."""
    data = yaml.safe_load(path.read_text())
    files = data["files"]
    for entry in files:
        assert set(entry) <= {"repo", "path", "commit", "lines", "partial"}, entry
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]), f"{entry['path']}: a commit is 40 hex digits"
        assert entry["lines"] is None or entry["lines"] > 0
    names = {}
    for recipe_file, table in data["names"].items():
        names[recipe_file] = {}
        for short, ref in table.items():
            repo, rest = ref.split(" ")
            path, commit = rest.rsplit("@", 1)
            found = [f for f in files if (f["repo"], f["path"]) == (repo, path) and f["commit"].startswith(commit)]
            assert len(found) == 1, f"released_files.yaml: names.{recipe_file}.{short} = {ref!r} is not one indexed file"
            names[recipe_file][short] = found[0]
    return files, names


def line_numbers(spec: str) -> list[int]:
    numbers = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        first, last = int(first), int(last or first)
        assert first <= last, f"line range {part} runs backwards"
        numbers += [first, last]
    return numbers


def citations(path: Path):
    """(line number in the recipe file, file token, lines spec or None, commit or None) of every citation."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if "#" in line:
            for m in CITATION.finditer(line[line.index("#"):]):
                yield number, m["file"], m["lines"], m["commit"]


def resolve(token: str, commit: str | None, names: dict[str, dict], files: list[dict]) -> dict | None:
    """The index entry a citation names (None: not in the index)."""
    if commit is not None:
        found = [f for f in files if (f["path"] == token or f["path"].endswith("/" + token))
                 and f["commit"].startswith(commit)]
        return found[0] if len(found) == 1 else None
    if token in names:
        return names[token]
    found = {id(f): f for f in names.values() if f["path"] == token}
    return next(iter(found.values())) if len(found) == 1 else None


def check_citations(recipe_dir: Path, index: Path = INDEX, pattern: str = "*.yaml") -> list[str]:
    files, names = load_index(index)
    problems = []
    for path in sorted(recipe_dir.glob(pattern)):
        table = names.get(path.name, {})
        for number, token, lines, commit in citations(path):
            where = f"{path.name}:{number}: {token}{':' + lines if lines else ''}{' at ' + commit if commit else ''}"
            entry = resolve(token, commit, table, files)
            if entry is None:
                if lines is None and commit is None and (ROOT / token).is_file():
                    continue  # a file of this project, not a released one
                problems.append(f"{where} names no file of benchmark/released_files.yaml")
                continue
            if lines is None:
                continue
            if entry["lines"] is None:
                problems.append(f"{where}: the index has no line count for {entry['path']} (it is cited without lines)")
                continue
            past = [n for n in line_numbers(lines) if not 1 <= n <= entry["lines"]]
            if past:
                problems.append(f"{where}: line {past[0]} is past the {entry['lines']} lines of {entry['path']} at "
                                f"{entry['commit'][:7]}")
    return problems


def test_every_citation_names_an_indexed_file_and_existing_lines():
    problems = check_citations(recipes.RECIPES_DIR)
    assert not problems, "\n".join(problems)


def test_the_paper_suites_cite_existing_lines():
    # their comments state each release's batch with its source
    problems = check_citations(ROOT / "benchmark" / "suites", pattern="paper-*.yaml")
    assert not problems, "\n".join(problems)


def test_the_recipes_cite_released_code():
    # the check has something to check: every released recipe file cites lines, through its short names
    counted = {path.name: sum(1 for *_, lines, _ in citations(path) if lines)
               for path in recipes.RECIPES_DIR.glob("*.yaml")}
    for name in ("flow_grpo.yaml", "flow_grpo_fast.yaml", "dance_grpo.yaml", "mix_grpo.yaml", "mix_grpo_flash.yaml"):
        assert counted[name] >= 3, name


@pytest.mark.parametrize("comment, problem", [
    ("lr: 1.0e-4  # grpo.py:9999 (learning_rate)", "line 9999 is past the 367 lines of config/grpo.py"),
    ("lr: 1.0e-4  # train_grpo_flux.py:12 (a short name this file does not define)", "names no file"),
    ("lr: 1.0e-4  # scripts/train_sd3.py:10 at 1234567 (a commit not read)", "names no file"),
    ("lr: 1.0e-4  # fastvideo/train_grpo_flux_lora.py:10 (another repository's file)", "names no file"),
    ("lr: 1.0e-4  # scripts/train_wan2_1.py:10 at 32b48fd (a file read without line counts)", "no line count"),
])
def test_a_wrong_path_commit_or_line_fails(tmp_path, comment, problem):
    (tmp_path / "flow_grpo.yaml").write_text(f"sd3:\n  {comment}\n")
    problems = check_citations(tmp_path)
    assert len(problems) == 1 and problem in problems[0], problems


def test_good_citations_pass(tmp_path):
    (tmp_path / "flow_grpo.yaml").write_text(
        "# Sources: \"grpo.py\" = config/grpo.py at 31c71b9; see algorithms/methods/flow_grpo_fast.py\n"
        "sd3:\n  lr: 1.0e-4  # grpo.py:1-367 and base.py:127, train_sd3.py:796-797,816-817\n"
        "  kl_beta: 0.0  # sd3_sde_with_logprob.py:68 at ac4c86e; scripts/train_wan2_1.py at 32b48fd\n"
    )
    assert check_citations(tmp_path) == []
