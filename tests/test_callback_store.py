"""The SQLite delivery store (the default), through a DeliveryTracker: the store contract
(tests/callback_store_contract.py), and what is SQLite's own: the file, durability."""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import dispatch_async as da
from dispatch_async.callbacks import (
    DeliveryEvent,
    DeliveryStatus,
    DeliveryTracker,
    SQLiteDeliveryStore,
)

from .callback_store_contract import (
    AnswersQuestions,
    CommitsInGroups,
    StreamsChanges,
    TracksOneMessage,
    event,
    reference,
)
from .conftest import HANG


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "deliveries.sqlite3"


@pytest.fixture
async def tracker(path: Path) -> AsyncIterator[DeliveryTracker]:
    async with DeliveryTracker(path, poll_interval=0.05) as opened:
        yield opened


@pytest.fixture
async def second_tracker(path: Path, tracker: DeliveryTracker) -> AsyncIterator[DeliveryTracker]:
    async with DeliveryTracker(SQLiteDeliveryStore(path), poll_interval=0.05) as opened:
        yield opened


class TestTracksOneMessage(TracksOneMessage):
    pass


class TestAnswersQuestions(AnswersQuestions):
    pass


class TestStreamsChanges(StreamsChanges):
    pass


class TestCommitsInGroups(CommitsInGroups):
    pass


class TestTheFile:
    async def test_an_acknowledged_event_is_committed_in_the_file(
        self, tracker: DeliveryTracker, path: Path
    ) -> None:
        ref = reference()
        await tracker.record(event(ref, "READ"))
        # Another connection sees only committed transactions.
        with sqlite3.connect(path) as other:
            rows = other.execute("SELECT status FROM messages WHERE reference = ?", (ref,))
            assert rows.fetchall() == [("read",)]
        other.close()

    async def test_an_event_not_stored_changes_no_message(self, tracker: DeliveryTracker) -> None:
        ref = reference()
        same = "0" * 32  # a message's two events with one key: the second is a re-delivery
        await tracker.record(DeliveryEvent(reference=ref, status=DeliveryStatus.SENT, key=same))
        await tracker.record(DeliveryEvent(reference=ref, status=DeliveryStatus.READ, key=same))
        state = await tracker.message(ref)
        assert state is not None
        assert (state.status, state.events) == (DeliveryStatus.SENT, 1)

    async def test_the_file_is_in_wal_mode_with_full_sync(
        self, tracker: DeliveryTracker, path: Path
    ) -> None:
        with sqlite3.connect(path) as other:
            assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        other.close()

    @pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
    async def test_the_file_and_its_wal_and_journal_are_its_owners_alone_whatever_the_umask(
        self, path: Path, umask: int
    ) -> None:
        previous = os.umask(umask)
        try:
            async with DeliveryTracker(path) as tracker:
                await tracker.record(event(reference(), "DELIVERED"))
                made = sorted(p.name for p in path.parent.iterdir())
                modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()}
        finally:
            os.umask(previous)
        assert made == [path.name, f"{path.name}-shm", f"{path.name}-wal"]
        assert set(modes.values()) == {0o600}

    async def test_a_rollback_journal_is_its_owners_alone(self, path: Path) -> None:
        previous = os.umask(0)
        try:
            async with DeliveryTracker(path):
                pass
            with sqlite3.connect(path) as other:  # out of WAL: a journal per transaction
                other.execute("PRAGMA journal_mode = DELETE")
                other.execute("PRAGMA journal_mode = PERSIST")
                other.execute(
                    "INSERT INTO events (reference, key, received, body) VALUES ('r', 'k', 0, x'')"
                )
            other.close()
        finally:
            os.umask(previous)
        assert stat.S_IMODE(os.stat(f"{path}-journal").st_mode) == 0o600

    async def test_a_time_stored_out_of_range_by_an_earlier_version_reads_back(
        self, path: Path
    ) -> None:
        ref = reference()
        async with DeliveryTracker(path) as tracker:
            await tracker.record(event(ref, "DELIVERED", number="5511900000043"))
        with sqlite3.connect(path) as other:  # as 0001-01-01T00:00:00+05:30 was stored
            other.execute(
                "UPDATE messages SET first_at = -62135616600.0 WHERE reference = ?", (ref,)
            )
        other.close()
        async with DeliveryTracker(path) as tracker:
            state = await tracker.message(ref)
            assert state is not None
            assert state.first_event_at.year == 1
            assert [s.reference for s in await tracker.messages_for("5511900000043")] == [ref]

    async def test_state_outlives_the_tracker(self, path: Path) -> None:
        ref = reference()
        async with DeliveryTracker(path) as first:
            await first.record(event(ref, "DELIVERED", channel="SMS"))
        async with DeliveryTracker(path) as second:
            state = await second.message(ref)
        assert state is not None
        assert state.status.value == "delivered_sms"

    async def test_a_file_that_is_not_sqlite_is_a_configuration_error(self, path: Path) -> None:
        await asyncio.to_thread(path.write_bytes, b"not a database, not at all" * 100)
        with pytest.raises(da.ConfigurationError, match="not a usable SQLite database"):
            await DeliveryTracker(path).open()
        gc.collect()
        connections = [o for o in gc.get_objects() if isinstance(o, sqlite3.Connection)]
        assert [c for c in connections if _is_open(c)] == [], "a connection was left open"

    async def test_a_failed_write_is_an_error_and_the_tracker_goes_on(
        self, tracker: DeliveryTracker
    ) -> None:
        store = tracker.store
        original = store.write
        failures = [sqlite3.OperationalError("disk I/O error")]

        async def failing_once(events: list[da.callbacks.DeliveryEvent], at: float) -> None:
            if failures:
                raise failures.pop()
            await original(events, at)

        store.write = failing_once  # type: ignore[method-assign]
        lost, kept = reference(), reference()
        with pytest.raises(da.DeliveryStoreError, match="OperationalError") as caught:
            await tracker.record(event(lost, "READ"))
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        await tracker.record(event(kept, "READ"))
        assert await tracker.message(lost) is None
        assert await tracker.message(kept) is not None


class TestLifecycle:
    async def test_recording_on_a_closed_tracker_is_refused(self, path: Path) -> None:
        tracker = DeliveryTracker(path)
        with pytest.raises(da.SessionClosedError):
            await tracker.record(event(reference(), "READ"))
        async with tracker:
            pass
        with pytest.raises(da.SessionClosedError):
            await tracker.record(event(reference(), "READ"))
        await tracker.aclose()  # idempotent

    async def test_a_tracker_opens_once(self, path: Path) -> None:
        async with DeliveryTracker(path) as tracker:
            pass
        with pytest.raises(da.SessionClosedError, match="closed"):
            await tracker.open()

    async def test_closed_while_it_opens_it_closes_its_store_and_the_open_is_refused(
        self, path: Path
    ) -> None:
        class SlowToOpen(SQLiteDeliveryStore):
            opening = asyncio.Event()
            go_on = asyncio.Event()
            closed = False

            async def open(self) -> None:
                self.opening.set()
                await self.go_on.wait()
                await super().open()

            async def aclose(self) -> None:
                await super().aclose()
                SlowToOpen.closed = True

        store = SlowToOpen(path)
        tracker = DeliveryTracker(store)
        opening = asyncio.ensure_future(tracker.open())
        async with asyncio.timeout(HANG):
            await store.opening.wait()
            closing = asyncio.ensure_future(tracker.aclose())  # runs before the open goes on
            store.go_on.set()
            with pytest.raises(da.SessionClosedError, match="closed while it opened"):
                await opening
            await closing
        assert SlowToOpen.closed, "the store the open began is closed, not leaked"


class TestTheSQLiteStoreOnItsOwn:
    async def test_used_before_it_is_opened_it_refuses_reads_and_writes(self, path: Path) -> None:
        store = SQLiteDeliveryStore(path)
        with pytest.raises(da.SessionClosedError, match="not open"):
            await store.message("m-1")
        with pytest.raises(da.SessionClosedError, match="not open"):
            await store.write([event(reference(), "READ")], 0.0)

    async def test_opened_twice_it_stays_one_store(self, path: Path) -> None:
        store = SQLiteDeliveryStore(path)
        await store.open()
        try:
            await store.open()
            kept = reference()
            await store.write([event(kept, "READ")], 0.0)
            assert await store.message(kept) is not None
        finally:
            await store.aclose()


class TestConfiguration:
    @pytest.mark.parametrize(
        ("setting", "value"),
        [
            ("max_batch", 0),
            ("max_batch", -1),
            ("max_batch", 1.5),
            ("poll_interval", 0),
            ("poll_interval", -1.0),
            ("poll_interval", float("nan")),
        ],
    )
    def test_a_setting_that_would_stall_it_is_refused_by_name(
        self, path: Path, setting: str, value: object
    ) -> None:
        with pytest.raises(da.ConfigurationError, match=setting):
            DeliveryTracker(path, **{setting: value})  # type: ignore[arg-type]


def _is_open(connection: sqlite3.Connection) -> bool:
    try:
        connection.total_changes  # noqa: B018 - raises once closed
    except sqlite3.ProgrammingError:
        return False
    return True
