"""The profile database: measured kernel times in SQLite. It is a cache, and fails like one.

- Busy (another process is writing): wait up to `BUSY_TIMEOUT_SECONDS`, saying so, then a one-line error.
- An old or foreign schema, or a corrupt file: moved aside (`profiles.sqlite.bad-<time>`) and rebuilt,
  with a warning; nothing measured is worth a crash.
- An unwritable cache directory: a one-line error naming it.

Rows are keyed by (signature, machine). A measurement taken while other processes were using the CPU is
stored with `contended = 1`; such rows are re-measured when the machine is quiet (see profile.py).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from kernorch.errors import KernorchError
from kernorch.options import cache_root, writable_dir

log = logging.getLogger("kernorch.profile")
T = TypeVar("T")

SCHEMA_VERSION = 2  # PRAGMA user_version of a database this code wrote
BUSY_TIMEOUT_SECONDS = 60.0
_LOCK_POLL_SECONDS = 1.0  # sqlite's own wait per attempt; between attempts the wait is reported
DATABASE_NAME = "profiles.sqlite"
_COLUMNS = ("signature", "machine", "seconds", "runs", "spread", "contended", "measured_at")


class ProfileDatabaseError(KernorchError):
    """The tuning database cannot be used: busy beyond the timeout, or its directory is not writable."""


@dataclass(frozen=True)
class Measurement:
    seconds: float  # median of the repeats
    runs: int
    spread: float  # interquartile range / median of the repeats
    contended: bool  # other processes were using the CPU (or the value looked implausible) and stayed so


class ProfileDatabase:
    def __init__(self, path: Path, busy_timeout: float = BUSY_TIMEOUT_SECONDS) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        writable_dir(path.parent, "the profile database")
        self.connection = self._open_or_rebuild()

    @staticmethod
    def open(cache_dir: Path | None = None) -> ProfileDatabase:
        return ProfileDatabase(cache_root(cache_dir) / DATABASE_NAME)

    # ------------------------------------------------------------------------------------ opening
    def _open_or_rebuild(self) -> sqlite3.Connection:
        try:
            return self._while_busy(self._open)
        except _SchemaMismatch as error:
            return self._rebuild(str(error))
        except sqlite3.DatabaseError as error:  # includes a non-busy OperationalError, e.g. "not a database"
            return self._rebuild(f"corrupt ({error})")

    def _rebuild(self, reason: str) -> sqlite3.Connection:
        aside = self.path.with_name(f"{self.path.name}.bad-{int(time.time())}")
        log.warning("profile database %s is unusable (%s): moved to %s, rebuilding", self.path, reason, aside.name)
        for suffix in ("", "-wal", "-shm"):
            part = Path(f"{self.path}{suffix}")
            if part.exists():
                part.replace(Path(f"{aside}{suffix}"))
        try:
            return self._open()
        except sqlite3.DatabaseError as error:
            raise ProfileDatabaseError(f"cannot create the profile database {self.path}: {error}") from None

    def _open(self) -> sqlite3.Connection:
        connection = sqlite3.connect(str(self.path), timeout=min(_LOCK_POLL_SECONDS, self.busy_timeout))
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            check = connection.execute("PRAGMA quick_check").fetchone()
            if not check or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            # read after the tables: a process creating the database commits its table and version together, so
            # a version read first could be the empty file's 0 next to the new table (schema "mismatch": the
            # first process's rows were moved aside)
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if not tables:
                # Another process may be creating it too: in one write transaction, and only if nobody did yet
                # (a plain CREATE TABLE failing here once took the first process's rows aside as "corrupt")
                connection.execute("BEGIN IMMEDIATE")
                connection.execute(
                    "CREATE TABLE IF NOT EXISTS measurements (signature TEXT NOT NULL, machine TEXT NOT NULL, "
                    "seconds REAL NOT NULL, runs INTEGER NOT NULL, spread REAL NOT NULL, contended INTEGER NOT NULL, "
                    "measured_at REAL NOT NULL, PRIMARY KEY (signature, machine))"
                )  # fmt: skip
                if connection.execute("PRAGMA user_version").fetchone()[0] == 0:
                    connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                connection.commit()
            elif version != SCHEMA_VERSION or "measurements" not in tables:
                raise _SchemaMismatch(f"schema version {version}, tables {sorted(tables)}; expected version "
                                      f"{SCHEMA_VERSION}")  # fmt: skip
            else:
                columns = tuple(row[1] for row in connection.execute("PRAGMA table_info(measurements)"))
                if columns != _COLUMNS:
                    raise _SchemaMismatch(f"columns {columns}")
            return connection
        except BaseException:
            connection.close()
            raise

    def _busy_error(self) -> ProfileDatabaseError:
        return ProfileDatabaseError(f"the profile database {self.path} stayed locked by another process for "
                                    f"{self.busy_timeout:g} s (another kernorch tuning?); try again when it is done")

    # ------------------------------------------------------------------------------------ queries
    def lookup(self, signatures: Iterable[str], machine: str) -> dict[str, Measurement]:
        found: dict[str, Measurement] = {}
        wanted = list(signatures)
        for start in range(0, len(wanted), 500):
            chunk = wanted[start: start + 500]
            rows = self._execute(
                f"SELECT signature, seconds, runs, spread, contended FROM measurements WHERE machine = ? AND "
                f"signature IN ({','.join('?' * len(chunk))})", [machine, *chunk]).fetchall()  # fmt: skip
            found.update({s: Measurement(float(t), int(r), float(sp), bool(c)) for s, t, r, sp, c in rows})
        return found

    def store(self, signature: str, machine: str, measurement: Measurement) -> None:
        # committed one row at a time: a killed run loses at most one measurement
        self._execute("INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (signature, machine, measurement.seconds, measurement.runs, measurement.spread,
                       int(measurement.contended), time.time()), commit=True)  # fmt: skip

    def count(self, machine: str, contended: bool | None = None) -> int:
        query = "SELECT COUNT(*) FROM measurements WHERE machine = ?"
        parameters: list[object] = [machine]
        if contended is not None:
            query += " AND contended = ?"
            parameters.append(int(contended))
        return int(self._execute(query, parameters).fetchone()[0])

    def _execute(self, query: str, parameters: Iterable[object], commit: bool = False) -> sqlite3.Cursor:
        def run() -> sqlite3.Cursor:
            cursor = self.connection.execute(query, list(parameters))
            if commit:
                self.connection.commit()
            return cursor

        return self._while_busy(run)

    def _while_busy(self, action: Callable[[], T]) -> T:
        """Run `action`; while another process holds the lock, wait (saying so once) up to the timeout."""
        started = time.monotonic()
        warned = False
        while True:
            try:
                return action()
            except sqlite3.OperationalError as error:
                if not _is_busy(error):
                    raise
                if time.monotonic() - started >= self.busy_timeout:
                    raise self._busy_error() from None
                if not warned:
                    log.warning("profile database %s is locked by another process; waiting up to %.0f s",
                                self.path, self.busy_timeout)
                    warned = True


class _SchemaMismatch(Exception):
    pass


def _is_busy(error: sqlite3.OperationalError) -> bool:
    text = str(error).lower()
    return "locked" in text or "busy" in text
