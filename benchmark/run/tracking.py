"""Optional experiment trackers (TensorBoard, Weights & Biases, MLflow, ...) through accelerate's public tracking API:
``Accelerator(log_with=...)``, ``init_trackers``, ``log``.

``metrics.csv`` is always written; ``train.trackers: [tensorboard, wandb, mlflow]`` additionally streams the
resolved config (secrets already ``***``) and every metrics row to the named trackers, from the main process only,
and at every evaluation the run's sample grid ``samples/step_N.png`` as an image captioned with its prompts
(``samples/step_N.json``, written beside it by :func:`benchmark.run.sample_pictures.save_samples`). A tracker whose package is
not installed is refused at config load, before any work (``pip install -e '.[trackers]'`` installs the three).

Where each writes (all under ``<run_dir>/trackers/``, nothing over the network unless asked):

* ``tensorboard``: event files in ``trackers/tensorboard/`` (scalars under their column names, the config as
  hyper-parameters, the grid as image ``samples`` and its prompts as text ``samples/prompts`` at the same step);
* ``wandb``: ``trackers/wandb/``; offline unless ``WANDB_MODE`` says otherwise (``wandb sync`` uploads later);
  project ``WANDB_PROJECT`` or ``flowzoo``, run name ``<task>/<algorithm>/s<seed>``; the grid as ``wandb.Image``
  with the prompts as its caption. W&B's console capture, code saving, git and system metadata are off, so the
  command line (which may hold a literal key) is never recorded;
* ``mlflow``: a local file store ``trackers/mlruns/`` unless ``MLFLOW_TRACKING_URI`` names another (MLflow 3 keeps
  the file store in maintenance mode: flowzoo sets ``MLFLOW_ALLOW_FILE_STORE=true`` for it; ``MLFLOW_TRACKING_URI=
  sqlite:///...`` selects MLflow's recommended local database instead); experiment
  ``<task>``, run ``<task>/<algorithm>/s<seed>``; the config as flattened parameters (``algorithm.lr``), the grid
  with ``mlflow.log_image(key="samples", step=N)`` and its prompts as the text artifact
  ``samples/step_N_prompts.txt``.

Any other tracker accelerate knows (and a custom one registered in its ``LOGGER_TYPE_TO_CLASS``) is passed through
to accelerate as it is: it gets the config and the rows, not the images.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from flowzoo.benchmark.run.tracker_services import check_services, mlflow_environment
from flowzoo.errors import ConfigError, RunError
from flowzoo.io import naming

#: the trackers flowzoo configures itself (directories, offline mode, images); their Python package
OWN = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
#: W&B settings that keep the command line, the environment, the code and the console out of the run's files
WANDB_SETTINGS = {"console": "off", "save_code": False, "disable_code": True, "disable_git": True,
                  "disable_job_creation": True, "x_disable_meta": True, "x_disable_stats": True, "silent": True}


def known_trackers() -> list[str]:
    """The tracker names accelerate knows (``LoggerType``), less ``all``."""
    from accelerate.utils import LoggerType

    return [t.value for t in LoggerType if t.value != "all"]


def available_trackers() -> list[str]:
    """The trackers whose packages are installed (accelerate's test, plus the import of our three)."""
    from accelerate.tracking import get_available_trackers

    found = [str(t) for t in get_available_trackers()]
    return [t for t in found if t not in OWN or importlib.util.find_spec(OWN[t]) is not None]


def check_trackers(names: Sequence[str]) -> None:
    """At config load: every name is a tracker (a typo is one line). What this machine has is checked only where
    training starts (:func:`check_tracker_environment`): ``eval``, ``export`` and the analysis of a run log to no
    tracker, so a run tracked elsewhere is still read here."""
    if not names:
        return
    known = known_trackers()
    for name in names:
        if name not in known:
            raise ConfigError(f"unknown tracker {name!r}; known: {', '.join(sorted(known))}")


def check_tracker_environment(names: Sequence[str]) -> None:
    """Where training starts (``Runner.run``, ``run_suite``), before anything is written: each tracker is installed,
    and its service answers (a server that is down, online W&B without a key: one line). A name that is no tracker
    accelerate knows (a custom one registered in its ``LOGGER_TYPE_TO_CLASS``) is its registrant's to check."""
    if not names:
        return
    known, available = known_trackers(), available_trackers()
    for name in names:
        if name in known and name not in available:
            hint = "pip install -e '.[trackers]'" if name in OWN else f"pip install {name}"
            raise ConfigError(f"tracker {name!r} is not installed ({hint}); installed trackers: "
                              f"{', '.join(available) or 'none'}")
    check_services(names)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"algorithm": {"lr": 1e-3}}`` -> ``{"algorithm.lr": 1e-3}``; lists and None become their JSON text, so every
    value is a bool, number or string (what TensorBoard's and MLflow's hyper-parameters take)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value, sort_keys=True, default=str)
    return out


def caption(prompts: Sequence[str]) -> str:
    """The prompts of a grid in reading order, one line each: ``1: class 0``."""
    return "\n".join(f"{i + 1}: {p}" for i, p in enumerate(prompts))


def _tracker_classes():
    """Our subclasses of accelerate's three trackers (built lazily: accelerate's module imports nothing heavy, but
    the subclasses' bodies import their packages only when a run uses them)."""
    return {"tensorboard": _tensorboard_class(), "wandb": _wandb_class(), "mlflow": _mlflow_class()}


def _tensorboard_class():
    """TensorBoard, resumed: the crashed tail purged, the history kept in its event files."""
    from accelerate.tracking import TensorBoardTracker

    class TensorBoard(TensorBoardTracker):
        #: its event files outlive the process: a resumed run's writer purges what the killed one logged after the
        #: checkpoint (SummaryWriter's purge_step) and is not sent the history again (duplicate points otherwise)
        keeps_history = True

        def __init__(self, run_name: str, logging_dir: Path, resumed_at: int = 0):
            super().__init__(run_name, logging_dir)
            self.resumed_at = resumed_at

        def start(self):
            from torch.utils.tensorboard import SummaryWriter

            self.logging_dir = str(self.logging_dir_param)
            held = any(Path(self.logging_dir).rglob("events.out.tfevents.*"))
            self.keeps_history = held  # a tracker added at a resume has none: it is sent the history
            # TensorBoard drops the events of steps >= purge_step written before this writer (the crashed tail)
            self.writer = SummaryWriter(self.logging_dir, purge_step=self.resumed_at + 1 if held else None)

        def store_init_configuration(self, values: dict):
            self.writer.add_hparams(flatten(values), metric_dict={}, run_name=".")
            self.writer.flush()

        def log_grid(self, image, prompts: Sequence[str], step: int) -> None:
            import numpy as np

            self.writer.add_image("samples", np.asarray(image.convert("RGB")), global_step=step, dataformats="HWC")
            self.writer.add_text("samples/prompts", caption(prompts).replace("\n", "  \n"), global_step=step)
            self.writer.flush()

    return TensorBoard


def _wandb_class():
    """Weights & Biases, offline unless ``WANDB_MODE`` says otherwise, its files under the run's ``trackers/``."""
    from accelerate.tracking import WandBTracker

    class WandB(WandBTracker):
        def __init__(self, run_name: str, logging_dir: Path):
            super().__init__(run_name)
            self.logging_dir = Path(logging_dir)

        def start(self):
            import wandb

            self.logging_dir.mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "flowzoo"), name=self.run_name,
                                  dir=str(self.logging_dir), mode=os.environ.get("WANDB_MODE", "offline"),
                                  settings=wandb.Settings(**WANDB_SETTINGS))

        def store_init_configuration(self, values: dict):
            self.run.config.update(values, allow_val_change=True)

        def log(self, values: dict, step: int | None = None, **kwargs):
            self.run.log(values, step=step, **kwargs)

        def log_grid(self, image, prompts: Sequence[str], step: int) -> None:
            import wandb

            self.run.log({"samples": wandb.Image(image, caption=caption(prompts))}, step=step)

    return WandB


def _mlflow_class():
    """MLflow, on the run's own file store unless ``MLFLOW_TRACKING_URI`` names another."""
    from accelerate.tracking import MLflowTracker

    class MLflow(MLflowTracker):
        def __init__(self, run_name: str, logging_dir: Path, experiment: str):
            super().__init__(experiment_name=experiment, run_name=run_name)
            self.store = Path(logging_dir)

        def start(self):
            import mlflow

            # the run's own file store, unless the user points MLflow at a server or another store; MLflow 3 keeps the
            # file store in maintenance mode and refuses it unless MLFLOW_ALLOW_FILE_STORE is set
            uri = os.environ.get("MLFLOW_TRACKING_URI") or self.store.resolve().as_uri()
            mlflow_environment(uri)  # the file store allowed, HTTP retries bounded
            mlflow.set_tracking_uri(uri)
            super().start()

        def store_init_configuration(self, values: dict):
            import mlflow

            params = [(k, v) for k, v in flatten(values).items()
                      if len(str(v)) <= mlflow.utils.validation.MAX_PARAM_VAL_LENGTH]
            batch = mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
            for i in range(0, len(params), batch):
                mlflow.log_params(dict(params[i:i + batch]))

        def log_grid(self, image, prompts: Sequence[str], step: int) -> None:
            import mlflow

            mlflow.log_image(image, key="samples", step=step)
            mlflow.log_text(caption(prompts), f"samples/step_{step}_prompts.txt")

        def finish(self):
            import mlflow

            mlflow.end_run()

    return MLflow


class Trackers:
    """The run's trackers: configuration stored once, then one ``log`` per metrics row (with the sample grid of an
    evaluation row). Built on the main process only, after :func:`check_trackers` (config load) and
    :func:`check_tracker_environment` (where training starts) passed."""

    def __init__(self, names: Sequence[str], run_name: str, run_dir: Path, config: dict[str, Any],
                 resumed_at: int = 0):
        from accelerate import Accelerator

        self.run_dir, self.names = Path(run_dir), [str(n) for n in names]
        root = self.run_dir / "trackers"
        own = _tracker_classes() if any(n in OWN for n in names) else {}
        folders = {"tensorboard": root / "tensorboard", "wandb": root, "mlflow": root / "mlruns"}
        log_with = []
        for name in names:
            if name == "mlflow":
                log_with.append(own[name](run_name, folders[name], experiment=str(config.get("task", run_name))))
            elif name == "tensorboard":
                log_with.append(own[name](run_name, folders[name], resumed_at))
            elif name in own:
                log_with.append(own[name](run_name, folders[name]))
            else:
                log_with.append(name)
        try:
            self.accelerator = Accelerator(log_with=log_with, project_dir=str(root))
            self.accelerator.init_trackers(run_name, config=config)
        except OSError as error:
            if error.filename is not None:
                raise
            raise RunError(f"trackers {', '.join(map(str, names))} could not start: {_first_line(error)}") from None
        except Exception as error:  # the tracker's service or package: one line naming it, never its traceback
            raise RunError(f"trackers {', '.join(map(str, names))} could not start: {type(error).__name__}: "
                           f"{_first_line(error)}") from None

    @contextlib.contextmanager
    def _reporting(self, what: str) -> Iterator[None]:
        """A tracker's failure during the run is one line: an OS error (a full disk under its writer's background
        thread raises one without a path) names ``trackers/``; any other names the trackers and the cause."""
        try:
            with naming(self.run_dir / "trackers"):
                yield
        except OSError:
            raise
        except Exception as error:  # the tracker's service (a server gone mid-run) or package
            raise RunError(f"trackers {', '.join(self.names)}: {what} failed: {type(error).__name__}: "
                           f"{_first_line(error)}") from None

    def log(self, row: dict[str, Any], step: int, trackers: Sequence | None = None) -> None:
        """One metrics row (and an evaluation row's sample grid) to ``trackers`` (default: every one)."""
        trackers = self.accelerator.trackers if trackers is None else trackers
        values = {k: float(v) for k, v in row.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(float(v)) and k != "step"}
        with self._reporting(f"logging step {step}"):
            for tracker in trackers:
                tracker.log(values, step=step)
            if "eval_reward" in row:  # an evaluation row: its sample grid, when the run saved one
                grid = self.run_dir / "samples" / f"step_{step}.png"
                if grid.is_file():
                    self.log_images(grid, _prompts(grid.with_suffix(".json")), step, trackers)

    def replay(self, rows: Sequence[dict[str, Any]]) -> None:
        """A resumed run's history, to every tracker that does not keep it across processes (a W&B or MLflow run
        starts anew; TensorBoard's event files hold it, less the purged tail)."""
        fresh = [t for t in self.accelerator.trackers if not getattr(t, "keeps_history", False)]
        if fresh:
            for row in rows:
                self.log(row, row["step"], fresh)

    def log_images(self, path: Path, prompts: Sequence[str], step: int, trackers: Sequence | None = None) -> None:
        """Log the image file ``path`` (a sample grid) at ``step`` to every tracker (of ``trackers``) that takes
        images, with ``prompts`` (the grid's samples' prompts in reading order) as its caption."""
        from PIL import Image

        with Image.open(path) as opened:
            image = opened.convert("RGB")
        for tracker in self.accelerator.trackers if trackers is None else trackers:
            if hasattr(tracker, "log_grid"):
                tracker.log_grid(image, list(prompts), step)

    def finish(self) -> None:
        # not ``end_training()``: it also destroys the torch.distributed process group, which the runner owns
        with self._reporting("finishing"):
            for tracker in self.accelerator.trackers:
                tracker.finish()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else "no detail"


def _prompts(path: Path) -> list[str]:
    """The prompts a grid's sidecar lists (none for a grid saved without one)."""
    try:
        return [str(p) for p in json.loads(path.read_text()).get("prompts") or []]
    except (OSError, ValueError, AttributeError):
        return []
