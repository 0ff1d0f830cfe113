"""``RedisDeliveryStore``: delivery state in Redis, for receivers on several hosts.

Every key starts with the caller's prefix (the rules of the token store: restrict the
Redis user to ``~<prefix>*``; on a Redis Cluster the prefix is braced, ``{<prefix>}``, so
every key is in one hash slot: a batch's script touches many of them). Per message
``<prefix>cb:m:<reference>`` (a hash: status, rank, channel, number, campaign, first and
last event time, event count),
``<prefix>cb:k:<reference>`` (the keys of its events: a re-delivery is recognised) and
``<prefix>cb:e:<reference>`` (its events, in order); ``<prefix>cb:n:<digits>`` (the
references of a number), ``<prefix>cb:c:=<campaign>`` (counts by status) and
``<prefix>cb:log`` (a stream: the change stream, trimmed to about ``log_length``).

A batch is one Lua script: atomic against every other receiver, so the status never
moves down even when two hosts fold events of one message at once. It is durable as
your Redis is (``appendonly yes`` with ``appendfsync always`` for the strictest).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from .._fleet.addresses import redacted_url
from .._fleet.connection import DEFAULT_KEY_PREFIX, RedisConnection, check_prefix
from ._events import DeliveryEvent, number_key
from ._status import DeliveryStatus
from ._store import MessageState, event_row, stored_event, utc

__all__ = ["RedisDeliveryStore"]

#: Entries the change stream keeps (approximately): a reader further behind misses some.
DEFAULT_LOG_LENGTH: Final = 1_000_000

# KEYS: 5 per event (its cb:k, cb:e, cb:m, cb:n (any key if it has no number), the
# counts of its campaign), then the counts of no campaign, the change stream, and the
# counts of the campaigns in ARGV[3..]. ARGV: the log length, how many more campaigns,
# their names, then 11 values per event (see write). "" is "none". Every key is declared:
# on a Cluster they are in one slot (the braced prefix). A message already counted under
# a campaign whose key is not declared: nothing is written, the script answers the
# campaigns it needs, and `write` calls it again with their keys.
_WRITE: Final = """
local maxlen, more = ARGV[1], tonumber(ARGV[2])
local events = 5 * ((#ARGV - 2 - more) / 11)
local log, counted = KEYS[events + 2], {['']= KEYS[events + 1]}
for c = 1, more do counted[ARGV[2 + c]] = KEYS[events + 2 + c] end
local first = 3 + more
for e = 0, events / 5 - 1 do counted[ARGV[first + e * 11 + 4]] = KEYS[e * 5 + 5] end
local missing = {}
for e = 0, events / 5 - 1 do
  local kept = redis.call('HGET', KEYS[e * 5 + 3], 'g')
  if kept and not counted[kept] then counted[kept] = true; missing[#missing + 1] = kept end
end
if #missing > 0 then return missing end
local function counts(name) return counted[name] end
for e = 0, events / 5 - 1 do
  local i, k = first + e * 11, e * 5
  local ref, key, digits, number, campaign = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4]
  local status, rank, channel = ARGV[i+5], tonumber(ARGV[i+6]), ARGV[i+7]
  local at_text, received, body = ARGV[i+8], ARGV[i+9], ARGV[i+10]
  local at = tonumber(at_text)
  local keys_of, events_of, m, refs_of = KEYS[k+1], KEYS[k+2], KEYS[k+3], KEYS[k+4]
  if redis.call('SADD', keys_of, key) == 1 then
    redis.call('RPUSH', events_of, key .. '\\n' .. received .. '\\n' .. body)
    local cur = redis.call('HMGET', m, 'r', 's', 'c', 'n', 'g', 'f', 'l')
    if not cur[1] then
      redis.call('HSET', m, 's', status, 'r', rank, 'c', channel, 'n', number,
                 'g', campaign, 'f', at_text, 'l', at_text, 'k', 1)
      if digits ~= '' then redis.call('SADD', refs_of, ref) end
      redis.call('HINCRBY', counts(campaign), status, 1)
    else
      local old, kept = cur[2], cur[5]
      if kept == '' and campaign ~= '' then
        redis.call('HINCRBY', counts(''), old, -1)
        redis.call('HINCRBY', counts(campaign), old, 1)
        redis.call('HSET', m, 'g', campaign)
        kept = campaign
      end
      if rank > tonumber(cur[1]) or (rank == tonumber(cur[1]) and status < old) then
        redis.call('HINCRBY', counts(kept), old, -1)
        redis.call('HINCRBY', counts(kept), status, 1)
        redis.call('HSET', m, 's', status, 'r', rank)
        if channel ~= '' then redis.call('HSET', m, 'c', channel) end
      elseif cur[3] == '' and channel ~= '' then
        redis.call('HSET', m, 'c', channel)
      end
      if cur[4] == '' and number ~= '' then
        redis.call('HSET', m, 'n', number)
        if digits ~= '' then redis.call('SADD', refs_of, ref) end
      end
      if at < tonumber(cur[6]) then redis.call('HSET', m, 'f', at_text) end
      if at > tonumber(cur[7]) then redis.call('HSET', m, 'l', at_text) end
      redis.call('HINCRBY', m, 'k', 1)
    end
    redis.call('XADD', log, 'MAXLEN', '~', maxlen, '*',
               'k', key, 't', received, 'b', body)
  end
end
return 0
"""


class RedisDeliveryStore:
    """Delivery state in Redis: for a fleet of receivers behind one callback URL.

    Args:
        redis_url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://``, the
            URL of any node of a Redis Cluster, or ``redis+sentinel://...``; or a
            redis-py asyncio client you built (``Redis``, ``RedisCluster``, Sentinel's
            ``master_for``), yours to close. See `RedisConnection`.
        key_prefix: every key starts with it (as for `RedisTokenStore`).
        log_length: about how many events the change stream keeps.
        ssl_ca_certs: with ``rediss://``, the CA file that signed the server's certificate.

    Raises:
        ConfigurationError: the redis extra is not installed, or a bad argument.
    """

    def __init__(
        self,
        redis_url: str | Any,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        log_length: int = DEFAULT_LOG_LENGTH,
        ssl_ca_certs: str | None = None,
    ) -> None:
        self._redis = RedisConnection(
            redis_url, ssl_ca_certs=ssl_ca_certs, feature="RedisDeliveryStore"
        )
        self.key_prefix = check_prefix(key_prefix)
        self.log_length = log_length
        self._script: Any = None

    def __repr__(self) -> str:
        url = redacted_url(self._redis.url)
        return f"<RedisDeliveryStore {url!r} key_prefix={self.key_prefix!r}>"

    async def open(self) -> None:
        """Check that Redis answers."""
        with self._redis.plain_errors():
            client = await self._redis.client()
            await client.ping()
        self._script = client.register_script(_WRITE)

    async def write(self, events: Sequence[DeliveryEvent], received_at: float) -> None:
        """Store *events* in one atomic script."""
        if not events:
            return
        with self._redis.plain_errors():
            client = await self._redis.client()  # first: a Cluster's keys are braced
        keys: list[str] = []
        arguments: list[str | bytes | int | float] = []
        for event in events:
            row = event_row(event, received_at)
            keys += (
                self._key("k", row.reference),
                self._key("e", row.reference),
                self._key("m", row.reference),
                self._key("n", row.digits),
                self._counts_key(row.campaign),
            )
            arguments += (
                row.reference,
                row.key,
                row.digits,
                row.number or "",
                row.campaign or "",
                row.status,
                row.rank,
                row.channel or "",
                repr(row.at),
                repr(row.received),
                row.body,
            )
        keys += (self._counts_key(None), self._key("log"))
        more: list[str] = []
        while True:
            with self._redis.plain_errors():
                missing = await self._script(
                    keys=[*keys, *map(self._counts_key, more)],
                    args=[self.log_length, len(more), *more, *arguments],
                    client=client,
                )
            if not missing:
                return
            more += (name.decode() for name in missing)

    async def message(self, reference: str) -> MessageState | None:
        """The state of one message, or None."""
        client = await self._redis.client()
        found = await client.hgetall(self._key("m", reference))
        return _state(reference, found) if found else None

    async def messages_for(
        self, number: str, campaign_name: str | None = None
    ) -> list[MessageState]:
        """The messages of *number* (any formatting), oldest first."""
        client = await self._redis.client()
        references = sorted(await client.smembers(self._key("n", number_key(number))))
        async with client.pipeline(transaction=False) as pipe:
            for reference in references:
                pipe.hgetall(self._key("m", reference.decode()))
            found = await pipe.execute()
        states = [_state(r.decode(), f) for r, f in zip(references, found, strict=True) if f]
        if campaign_name is not None:
            states = [s for s in states if s.campaign_name == campaign_name]
        return sorted(states, key=lambda s: (s.first_event_at, s.reference))

    async def events(self, reference: str) -> list[DeliveryEvent]:
        """One message's events, in the order they were stored."""
        client = await self._redis.client()
        entries = await client.lrange(self._key("e", reference), 0, -1)
        events = []
        for entry in entries:
            key, received, body = entry.split(b"\n", 2)
            events.append(stored_event(body, key.decode(), float(received)))
        return events

    async def counts(self, campaign_name: str | None) -> dict[DeliveryStatus, int]:
        """Messages of a campaign by status."""
        client = await self._redis.client()
        found = await client.hgetall(self._counts_key(campaign_name))
        counts = {DeliveryStatus(k.decode()): int(v) for k, v in found.items()}
        return {status: count for status, count in counts.items() if count > 0}

    async def changes(self, after: str | None, limit: int) -> tuple[list[DeliveryEvent], str]:
        """Events stored after stream id *after*, and the id of the last one."""
        client = await self._redis.client()
        log = self._key("log")
        if after is None:
            last = await client.xrevrange(log, count=1)
            return [], last[0][0].decode() if last else "0-0"
        entries = await client.xrange(log, min=f"({after}", count=limit)
        events = [
            stored_event(fields[b"b"], fields[b"k"].decode(), float(fields[b"t"]))
            for _, fields in entries
        ]
        return events, entries[-1][0].decode() if entries else after

    async def aclose(self) -> None:
        """Close the connections to Redis made here (a client you gave stays open)."""
        await self._redis.aclose()

    def _key(self, kind: str, name: str | None = None) -> str:
        """The key of *kind* (and *name*): braced prefix on a Cluster (call once connected)."""
        key = f"{self._redis.key_tag(self.key_prefix)}cb:{kind}"
        return key if name is None else f"{key}:{name}"

    def _counts_key(self, campaign_name: str | None) -> str:
        return self._key("c", f"={campaign_name}" if campaign_name else "-")


def _state(reference: str, found: dict[bytes, bytes]) -> MessageState:
    def text(field: bytes) -> str | None:
        value = found.get(field, b"")
        return value.decode() if value else None

    return MessageState(
        reference=reference,
        status=DeliveryStatus(found[b"s"].decode()),
        channel=text(b"c"),
        number=text(b"n"),
        campaign_name=text(b"g"),
        first_event_at=utc(float(found[b"f"])),
        last_event_at=utc(float(found[b"l"])),
        events=int(found[b"k"]),
    )
