"""``SQLiteDeliveryStore``: delivery state in one SQLite file (stdlib ``sqlite3``, WAL).

Two tables: ``events`` (one row per distinct event, unique by reference and ``key``, one
index for both uniqueness and a message's events: a re-delivery is ignored; ``seq`` orders
the change stream) and ``messages`` (one row per reference,
folded from its events by an upsert that only ever raises the status's rank). A batch
is one transaction, committed with ``synchronous=FULL``: once ``write`` returns, the
events survive a crash of the process and of the machine.

sqlite3 blocks, so each connection lives on a thread of its own: one writes, one reads
(WAL lets readers run beside the writer, in this process or another).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

from .._exceptions import ConfigurationError, SessionClosedError
from ._events import DeliveryEvent, number_key
from ._status import DeliveryStatus
from ._store import MessageState, event_row, stored_event, utc

__all__ = ["SQLiteDeliveryStore"]

_T = TypeVar("_T")

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    reference TEXT NOT NULL,
    key TEXT NOT NULL,
    received REAL NOT NULL,
    body BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_reference ON events (reference, key);
CREATE TABLE IF NOT EXISTS messages (
    reference TEXT PRIMARY KEY,
    digits TEXT,
    number TEXT,
    campaign TEXT,
    status TEXT NOT NULL,
    rank INTEGER NOT NULL,
    channel TEXT,
    first_at REAL NOT NULL,
    last_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS messages_by_digits ON messages (digits);
CREATE INDEX IF NOT EXISTS messages_by_campaign ON messages (campaign, status);
"""

_INSERT_EVENT: Final = (
    "INSERT OR IGNORE INTO events (key, reference, received, body) VALUES (?, ?, ?, ?)"
)
# Idempotent, so a re-delivered event may go through it again: the status only moves to
# a higher rank (at equal ranks the lesser status name, whatever the order), the times
# only widen, names fill in once.
_FOLD_MESSAGE: Final = """
INSERT INTO messages
    (reference, digits, number, campaign, status, rank, channel, first_at, last_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (reference) DO UPDATE SET
    digits = coalesce(digits, excluded.digits),
    number = coalesce(number, excluded.number),
    campaign = coalesce(campaign, excluded.campaign),
    status = CASE WHEN excluded.rank > rank OR (excluded.rank = rank AND excluded.status < status)
                  THEN excluded.status ELSE status END,
    channel = CASE WHEN excluded.rank > rank OR (excluded.rank = rank AND excluded.status < status)
                   THEN coalesce(excluded.channel, channel)
                   ELSE coalesce(channel, excluded.channel) END,
    rank = max(rank, excluded.rank),
    first_at = min(first_at, excluded.first_at),
    last_at = max(last_at, excluded.last_at)
"""
_MESSAGE_COLUMNS: Final = (
    "reference, status, channel, number, campaign, first_at, last_at, "
    "(SELECT count(*) FROM events WHERE events.reference = messages.reference)"
)
#: Pages of cache per connection (negative: KiB): fixed, so memory stays flat however
#: many messages the file holds.
_CACHE_KIB: Final = 32 * 1024
#: WAL pages between checkpoints (about 40 MiB): a checkpoint writes back a page changed
#: by many commits once, where SQLite's default (1,000) rewrote it every few commits.
_CHECKPOINT_PAGES: Final = 10_000


class SQLiteDeliveryStore:
    """Delivery state in one SQLite file: the default store, for one host.

    Put the file beside the job's results. Several processes may open it (one receiver
    writing, others reading); the file is created on first use.

    Args:
        path: the database file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._write_thread: ThreadPoolExecutor | None = None
        self._read_thread: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"<SQLiteDeliveryStore {str(self.path)!r}>"

    async def open(self) -> None:
        """Open (and create) the file; idempotent."""
        if self._writer is not None:
            return
        self._write_thread = ThreadPoolExecutor(1, thread_name_prefix="dispatch-async-sqlite-w")
        self._read_thread = ThreadPoolExecutor(1, thread_name_prefix="dispatch-async-sqlite-r")
        try:
            self._writer = await self._on(self._write_thread, self._connect_writer)
            self._reader = await self._on(self._read_thread, self._connect)
        except BaseException:
            await self.aclose()
            raise

    async def write(self, events: Sequence[DeliveryEvent], received_at: float) -> None:
        """Store *events* in one transaction; durable on return."""
        await self._on(self._write_thread, lambda: self._write(events, received_at))

    async def message(self, reference: str) -> MessageState | None:
        """The state of one message, or None."""
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE reference = ?"  # noqa: S608
        rows = await self._read(sql, (reference,))
        return _state(rows[0]) if rows else None

    async def messages_for(
        self, number: str, campaign_name: str | None = None
    ) -> list[MessageState]:
        """The messages of *number* (any formatting), oldest first."""
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE digits = ?"  # noqa: S608
        params: tuple[object, ...] = (number_key(number),)
        if campaign_name is not None:
            sql += " AND campaign = ?"
            params += (campaign_name,)
        rows = await self._read(sql + " ORDER BY first_at, reference", params)
        return [_state(row) for row in rows]

    async def events(self, reference: str) -> list[DeliveryEvent]:
        """One message's events, in the order they were stored."""
        rows = await self._read(
            "SELECT body, key, received FROM events WHERE reference = ? ORDER BY seq",
            (reference,),
        )
        return [stored_event(body, key, received) for body, key, received in rows]

    async def counts(self, campaign_name: str | None) -> dict[DeliveryStatus, int]:
        """Messages of a campaign by status."""
        where = "campaign IS NULL" if campaign_name is None else "campaign = ?"
        rows = await self._read(
            f"SELECT status, count(*) FROM messages WHERE {where} GROUP BY status",  # noqa: S608
            () if campaign_name is None else (campaign_name,),
        )
        return {DeliveryStatus(status): count for status, count in rows}

    async def changes(self, after: str | None, limit: int) -> tuple[list[DeliveryEvent], str]:
        """Events stored after cursor *after* (a sequence number), and the next cursor."""
        if after is None:
            [(last,)] = await self._read("SELECT coalesce(max(seq), 0) FROM events", ())
            return [], str(last)
        rows = await self._read(
            "SELECT seq, body, key, received FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (int(after), limit),
        )
        events = [stored_event(body, key, received) for _, body, key, received in rows]
        return events, str(rows[-1][0]) if rows else after

    async def aclose(self) -> None:
        """Close both connections and their threads; idempotent."""
        for thread, attribute in ((self._write_thread, "_writer"), (self._read_thread, "_reader")):
            connection = getattr(self, attribute)
            setattr(self, attribute, None)
            if thread is None:
                continue
            if connection is not None:
                await self._on(thread, connection.close)
            thread.shutdown(wait=False)
        self._write_thread = self._read_thread = None

    # On the store's threads

    def _connect(self) -> sqlite3.Connection:
        _create_private(self.path)
        connection = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        try:
            connection.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
        except BaseException:
            connection.close()  # a refused file leaves no connection behind
            raise
        return connection

    def _connect_writer(self) -> sqlite3.Connection:
        try:
            return self._set_up_writer(self._connect())
        except sqlite3.DatabaseError as exc:
            raise ConfigurationError(f"{self.path}: not a usable SQLite database ({exc})") from None

    def _set_up_writer(self, connection: sqlite3.Connection) -> sqlite3.Connection:
        try:
            if connection.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
                raise ConfigurationError(f"{self.path}: SQLite cannot use WAL on this file")
            connection.execute("PRAGMA synchronous = FULL")
            connection.execute(f"PRAGMA wal_autocheckpoint = {_CHECKPOINT_PAGES}")
            connection.execute(f"PRAGMA journal_size_limit = {_CHECKPOINT_PAGES * 4096 * 2}")
            connection.executescript(_SCHEMA)
        except BaseException:
            connection.close()  # a refused file leaves no connection behind
            raise
        return connection

    def _write(self, events: Sequence[DeliveryEvent], received_at: float) -> None:
        connection = self._writer
        if connection is None:
            raise SessionClosedError("the delivery store is closed")
        rows = [event_row(event, received_at) for event in events]
        connection.execute("BEGIN IMMEDIATE")
        try:
            [(last,)] = connection.execute("SELECT coalesce(max(seq), 0) FROM events")
            connection.executemany(
                _INSERT_EVENT, [(r.key, r.reference, r.received, r.body) for r in rows]
            )
            # Only what was inserted is folded: an ignored row was stored before.
            inserted = "SELECT reference, key FROM events WHERE seq > ?"
            new = set(connection.execute(inserted, (last,)))
            folds = []
            for r in rows:  # an event twice in the batch was inserted once
                if (r.reference, r.key) in new:
                    new.discard((r.reference, r.key))
                    fold = (r.reference, r.digits or None, r.number, r.campaign, r.status)
                    folds.append((*fold, r.rank, r.channel, r.at, r.at))
            connection.executemany(_FOLD_MESSAGE, folds)
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    async def _read(self, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        def query() -> list[tuple[Any, ...]]:
            if self._reader is None:
                raise SessionClosedError("the delivery store is closed")
            return self._reader.execute(sql, params).fetchall()

        return await self._on(self._read_thread, query)

    @staticmethod
    async def _on(thread: ThreadPoolExecutor | None, call: Callable[[], _T]) -> _T:
        if thread is None:
            raise SessionClosedError("the delivery store is not open")
        return await asyncio.get_running_loop().run_in_executor(thread, call)


def _state(row: tuple[Any, ...]) -> MessageState:
    reference, status, channel, number, campaign, first_at, last_at, events = row
    return MessageState(
        reference=str(reference),
        status=DeliveryStatus(status),
        channel=None if channel is None else str(channel),
        number=None if number is None else str(number),
        campaign_name=None if campaign is None else str(campaign),
        first_event_at=utc(float(first_at)),
        last_event_at=utc(float(last_at)),
        events=int(events),
    )


def _create_private(path: Path) -> None:
    """Create the file readable by its owner only (it holds phone numbers), whatever the
    umask; SQLite gives its WAL, shared-memory and journal files the same mode."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(descriptor, 0o600)  # a umask takes bits away from os.open's mode
    finally:
        os.close(descriptor)
