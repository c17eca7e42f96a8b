"""The trackers' external services, checked where training starts (``Runner.run``, ``run_suite``: before anything is
written; ``eval``, ``export`` and the analysis log to no tracker, so they never wait on one), so that nothing hangs
or ends in a traceback:

* ``mlflow`` with ``MLFLOW_TRACKING_URI=http(s)://host[:port]``: the server must accept a connection within
  ``PROBE_TIMEOUT_S`` (a server that is down was ~5 minutes of MLflow's retries, then a long traceback); during the
  run MLflow's own HTTP timeout and retries are bounded (``MLFLOW_HTTP_REQUEST_TIMEOUT``, ``_MAX_RETRIES``, unless
  set). ``file://`` URIs and plain paths select a file store, as without the variable (MLflow 3 refuses the file store
  unless ``MLFLOW_ALLOW_FILE_STORE`` is set, so it is set for them).
* ``wandb`` with ``WANDB_MODE=online``: an API key must be there (``WANDB_API_KEY``, or the ``wandb login`` entry in
  ``~/.netrc`` for the W&B host); offline (the default) needs none.

Every refusal is one line naming the service, the variable and what to do; no message echoes a credential.
"""

from __future__ import annotations

import netrc
import os
import socket
from typing import Sequence
from urllib.parse import urlsplit

from flowzoo.errors import ConfigError

PROBE_TIMEOUT_S = 5.0
#: MLflow's HTTP client during a run (its defaults: 120 s a request, 7 retries with back-off)
MLFLOW_HTTP = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "30", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
WANDB_ONLINE = ("online", "run")


def check_services(names: Sequence[str]) -> None:
    if "mlflow" in names:
        check_mlflow(os.environ.get("MLFLOW_TRACKING_URI", ""))
    if "wandb" in names:
        check_wandb()


def _server(uri: str) -> str:
    """``scheme://host:port`` of ``uri``: no credentials, path or query (what a message may show)."""
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.hostname or '?'}{f':{parts.port}' if parts.port else ''}"


def is_file_store(uri: str) -> bool:
    return uri.startswith("file:") or "://" not in uri


def check_mlflow(uri: str) -> None:
    if not uri.startswith(("http://", "https://")):
        return
    try:
        parts = urlsplit(uri)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:  # a port that is no number
        raise ConfigError(f"tracker mlflow: MLFLOW_TRACKING_URI is not a valid URL ({error})") from None
    if not host:
        raise ConfigError(f"tracker mlflow: MLFLOW_TRACKING_URI {_server(uri)} names no host")
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as error:
        cause = "no answer" if isinstance(error, socket.timeout) else (error.strerror or type(error).__name__)
        raise ConfigError(
            f"tracker mlflow: the tracking server MLFLOW_TRACKING_URI={_server(uri)} cannot be reached ({cause}, "
            f"{PROBE_TIMEOUT_S:g} s); start it, or unset MLFLOW_TRACKING_URI to log to the run's own store "
            f"(trackers/mlruns)") from None


def mlflow_environment(uri: str) -> None:
    """What MLflow needs from the environment for ``uri`` (see the module docstring); keeps values the user set."""
    if is_file_store(uri):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    for name, value in MLFLOW_HTTP.items():
        os.environ.setdefault(name, value)


def check_wandb() -> None:
    mode = os.environ.get("WANDB_MODE", "offline")
    if mode not in WANDB_ONLINE or os.environ.get("WANDB_API_KEY"):
        return
    host = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        if netrc.netrc().authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):  # no ~/.netrc, or one that cannot be read
        pass
    raise ConfigError(f"tracker wandb: WANDB_MODE={mode} needs a W&B API key (WANDB_API_KEY, or `wandb login` for "
                      f"{host}); without WANDB_MODE it logs offline into the run's trackers/wandb (`wandb sync` "
                      f"uploads later)")
