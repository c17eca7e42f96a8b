"""The tuning's storage: the default SQLite file, the checks of a ``--storage`` URL (shared by every worker and job,
never an in-memory or a node-local file under SLURM, read without writing by ``--report``), the masking of its
password in every line, how a password reaches the jobs, and opening it (the schema made under a lock on a fresh
SQLite file; the claim lock that orders the pops of queued trials)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from flowzoo.benchmark.run.suite import Suite
from flowzoo.benchmark.tuning.budget import _retry
from flowzoo.errors import ConfigError


#: seconds between a worker's heartbeats, and the silence after which another host's trial counts as dead
HEARTBEAT_S, GRACE_S = 20, 120


def default_storage(runs_dir: Path, suite: Suite, create: bool = True) -> str:
    """The SQLite file under ``runs_dir`` the trials go to (its folder made when ``create``)."""
    path = Path(runs_dir) / suite.name / "tuning" / "optuna.db"
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.resolve()}"


def check_report_storage(url: str, suite: Suite) -> None:
    """``tune --report`` reads trials, never starts a storage: a SQLite file that does not exist is one line (opening
    it would create an empty database and report 0 trials for every cell)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)  # check_storage has refused what is no URL
    if parsed.drivername.startswith("sqlite") and parsed.database and not Path(parsed.database).is_file():
        raise ConfigError(f"--report: no tuning storage at {parsed.database}: no trial of {suite.name} ran there; run "
                          f"`flowzoo tune {suite.name}` with the same --runs first, or give its --storage URL")
    if parsed.drivername.startswith("sqlite") and parsed.database:
        check_sqlite_storage(Path(parsed.database))


#: tables every Optuna storage holds (optuna/storages/_rdb/models.py); a file without them is no tuning storage
OPTUNA_TABLES = {"studies", "trials", "version_info"}


def check_sqlite_storage(path: Path) -> None:
    """``--report`` reads a SQLite file without changing it: an empty file, another program's database or no
    database at all is one line (opening it through Optuna would write Optuna's tables into it)."""
    import sqlite3

    if path.stat().st_size == 0:
        raise ConfigError(f"--report: {path} is an empty file, not a tuning storage (flowzoo tune writes one)")
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as error:
        raise ConfigError(f"--report: {path} is not a SQLite database ({error}); give the tuning's storage") from None
    finally:
        connection = None
    missing = OPTUNA_TABLES - tables
    if missing:
        raise ConfigError(f"--report: {path} is a SQLite database without Optuna's tables ({', '.join(sorted(missing))} "
                          f"missing): another program's, not a tuning storage; nothing was written to it")


#: query and keyword/value parameters that carry a password in the URLs and connection strings libpq, MySQL drivers
#: and SQLAlchemy accept
PASSWORD_KEYS = ("password", "passwd", "pwd", "sslpassword")


def shown_url(url: str) -> str:
    """A storage URL as every line prints it: its password masked in each form libpq accepts, the userinfo
    (``postgresql://user:***@host/db``, the password running to the last ``@``, so a ``/`` or ``@`` in it is masked
    too) and the parameters (``...?password=***``, ``host=h password=***``)."""
    text = str(url)
    head, mark, query = text.partition("?")
    scheme = head.find("://")
    if scheme >= 0 and "@" in head[scheme + 3:]:
        userinfo, _, rest = head[scheme + 3:].rpartition("@")
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        head = f"{head[:scheme + 3]}{userinfo}@{rest}"
    keys = "|".join(PASSWORD_KEYS)
    masked = re.sub(rf"(?i)(^|[?&;\s])({keys})(\s*=\s*)('[^']*'|[^&;\s]*)", r"\1\2\3***", head + mark + query)
    return masked


#: what a tune job receives in place of a storage URL that holds a password: the path of a file only its owner reads
SECRET_FILE = "flowzoo-secret-file:"


def storage_for_jobs(url: str, folder: Path) -> str:
    """The storage as the scheduler's jobs receive it: ``url`` itself when it holds no password, else a reference to
    ``folder/storage.url`` (written with 0600 rights), so that neither submitit's pickled job nor jobs.json nor a log
    holds the password."""
    if shown_url(url) == url:
        return url
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "storage.url"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write(url)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
    return SECRET_FILE + str(path.resolve())


def resolve_storage(value: str) -> str:
    """A job's storage: the URL, or the one the referenced secret file holds (``storage_for_jobs``)."""
    if not value.startswith(SECRET_FILE):
        return value
    path = value[len(SECRET_FILE):]
    try:
        return Path(path).read_text().strip()
    except OSError as error:
        raise ConfigError(f"the tune job's storage file {path} cannot be read ({error.strerror})") from None


#: seconds a database server may take to accept a connection before the tune command fails in one line
CONNECT_TIMEOUT_S = 30


def engine_kwargs(url: str) -> dict:
    """SQLAlchemy engine arguments by database: SQLite waits up to 120 s for another worker's write lock; a server
    (PostgreSQL, MySQL) must answer within ``CONNECT_TIMEOUT_S`` (their drivers' default is to wait for the OS, minutes
    on an unroutable host)."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 120}}
    if url.startswith(("postgresql", "postgres", "mysql", "mariadb")):
        return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    return {}


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite storage URL; None for a database server, an in-memory SQLite or what is no URL."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def schema_ready(path: str) -> bool:
    """Whether the SQLite file holds Optuna's schema, stamped (``alembic_version``, the last thing Optuna writes when
    it makes a storage); a read-only look, False for a missing, unreadable or half-made file."""
    import sqlite3
    from urllib.parse import quote

    if not Path(path).is_file():
        return False
    connection = None
    try:
        connection = sqlite3.connect(f"file:{quote(str(Path(path).resolve()))}?mode=ro", uri=True)
        return connection.execute("SELECT 1 FROM alembic_version").fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        if connection is not None:
            connection.close()


def schema_lock(url: str):
    """A lock file beside a SQLite storage whose schema is not made yet (``optuna.db.schema.lock``), held while Optuna
    makes it; a no-op for a made one or a database server.

    Optuna makes a new storage's tables, then reads that no schema version is stamped and stamps one; two processes
    opening one new SQLite file at once both read "none" and the second stamp fails (``IntegrityError`` on
    ``alembic_version``, or "table ... already exists"): three ``flowzoo tune`` commands started at once on a fresh
    storage lost one about half the time. Under the lock the first makes the schema and the others find it made."""
    from contextlib import nullcontext

    from filelock import FileLock

    path = sqlite_file(url)
    if path is None or schema_ready(path):
        return nullcontext()
    return FileLock(f"{path}.schema.lock")


def open_storage(url: str):
    """An Optuna RDB storage with heartbeats (a dead process's trial is failed and re-run)."""
    import optuna

    import warnings

    kwargs = engine_kwargs(url)
    try:
        with schema_lock(url), warnings.catch_warnings():  # heartbeats are "experimental" in Optuna 5; we rely on them
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S, heartbeat_stale_trial_callback=_retry)
    except Exception as error:  # sqlalchemy's errors: a bad URL, an unreachable server
        raise ConfigError(f"--storage {shown_url(url)}: {type(error).__name__}: {str(error).splitlines()[0]}") from None


def check_storage(url: str, executor_kind: str = "local") -> str | None:
    """Refuse a storage the workers cannot share; returns a note to print (SQLite under SLURM jobs), or None.

    An in-memory SQLite database lives and dies with one process: no worker, job or ``--report`` would see another's
    trials. SLURM jobs run on other nodes: a SQLite file under a node-local directory (/tmp, /var/tmp, /dev/shm,
    $TMPDIR) is refused; elsewhere the file must be on a file system every node mounts, and SQLite's locking over a
    network file system is only fit for a few jobs: for many nodes a database server (``postgresql://...``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as error:  # not a URL, or a port that is no number
        raise ConfigError(f"--storage {shown_url(url)}: not a database URL ({str(error).splitlines()[0]}); e.g. "
                          f"sqlite:////shared/tune.db or postgresql://host/db") from None
    if not parsed.drivername.startswith("sqlite"):
        return None
    if parsed.database in (None, "", ":memory:"):
        raise ConfigError(f"--storage {shown_url(url)}: an in-memory SQLite database lives in one process, so workers, jobs and "
                          f"--report would not share its trials; give a file (sqlite:////path/tune.db) or a server URL")
    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(parsed.database, "--storage")  # the SQLite file is written
    if executor_kind != "slurm":
        return None
    path = Path(parsed.database).resolve()
    local = [Path(d).resolve() for d in ("/tmp", "/var/tmp", "/dev/shm", os.environ.get("TMPDIR") or "/tmp")]
    under = next((d for d in local if path == d or d in path.parents), None)
    if under is not None:
        raise ConfigError(f"--storage {shown_url(url)}: {path} is under {under}, a node-local directory SLURM jobs on other nodes "
                          f"do not see; put the database on a shared file system (--runs or --storage "
                          f"sqlite:////shared/dir/tune.db) or give a server URL (postgresql://host/db)")
    return (f"SQLite storage {path}: every job must see it on a shared file system; for jobs on many nodes give a "
            f"database server (--storage postgresql://host/db)")


def claim_lock(storage_url: str):
    """A lock file beside a SQLite storage, held from Optuna's ``ask`` until the objective has claimed its trial, or
    None for a database server.

    Optuna pops a queued trial by reading its state and then writing RUNNING; SQLite gives no row lock between the two
    (PostgreSQL and MySQL do: ``SELECT ... FOR UPDATE``), so two workers that ask at the same moment can both pop one
    queued trial, both train into its run directory, and the loser's told state breaks the winner's trial ("Cannot
    tell a PRUNED trial", seen resuming a 2-worker tune). A SQLite file is one host's, so a host lock orders the pops.
    """
    from filelock import FileLock

    if not storage_url.startswith("sqlite:///"):
        return None
    return FileLock(storage_url[len("sqlite:///"):] + ".claim.lock")
