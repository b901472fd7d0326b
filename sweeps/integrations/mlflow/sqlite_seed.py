"""A new SQLite MLflow store begins as a copy of an empty one MLflow made at its current schema.

MLflow builds a new SQLite store by running every one of its schema migrations, each committed on its own: about
0.8 s of CPU and, with each commit's fsync, seconds of wall time on every fresh sweep (issue #47: start-up). The
empty store it would make is the same every time for one MLflow version, so the first one is kept in the cache
folder (calib_core/cache_dir.py) without its Default experiment, whose artifact location names the folder it was made
in; MLflow adds that experiment itself, for the folder it is used from, when it opens the copy (SqlAlchemyStore
creates experiment 0 whenever it is missing). Anything unusual (no cache, a read-only cache, a URI with options,
a file system without hard links) leaves the store to MLflow as before.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
from contextlib import closing
from pathlib import Path

SQLITE = "sqlite:///"


def _template_path() -> Path | None:
    """The cached empty store for this MLflow and SQLAlchemy, or None when nothing is cached."""
    from importlib.metadata import version

    from calib_core.cache_dir import cache_root

    root = cache_root()
    if root is None:
        return None
    return root / "mlflow-store" / f"mlflow-{version('mlflow')}-sqlalchemy-{version('sqlalchemy')}.db"


def _make_template(path: Path) -> None:
    """An empty store made by MLflow itself, its Default experiment taken out, kept whole at `path`."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with tempfile.TemporaryDirectory(prefix="mlflow-store-") as tmp:
        db = Path(tmp) / "empty.db"
        store = SqlAlchemyStore(f"{SQLITE}{db}", str(Path(tmp) / "artifacts"))
        store.engine.dispose()
        with closing(sqlite3.connect(db)) as con:
            with con:
                con.execute("DELETE FROM experiment_tags WHERE experiment_id = 0")
                con.execute("DELETE FROM experiments WHERE experiment_id = 0")
            con.execute("VACUUM")  # the migrations' free pages
        from calib_core.cache_dir import write_whole

        write_whole(path, lambda f: f.write(db.read_bytes()))


def seed_sqlite_store(tracking_uri: str) -> bool:
    """Create a SQLite store that does not exist yet as a copy of the cached empty one; True when it did."""
    if not tracking_uri.startswith(SQLITE) or "?" in tracking_uri:
        return False
    path = Path(tracking_uri.removeprefix(SQLITE))
    template = _template_path()
    if template is None or path.exists() or not path.parent.is_dir():
        return False
    try:
        if not template.exists():
            template.parent.mkdir(parents=True, exist_ok=True)  # an unusable cache folder: refused before the work
            _make_template(template)
        data = template.read_bytes()
    except Exception:  # noqa: BLE001 - no template: MLflow makes the store as it always did
        return False
    tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.seed"
    try:
        # the mode MLflow's own file would have (the umask applies), not mkstemp's 0600
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, path)  # never over a store another process made meanwhile
        finally:
            os.unlink(tmp)
    except OSError:
        return False
    return True
