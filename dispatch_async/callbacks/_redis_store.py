"""``RedisDeliveryStore``: delivery state in Redis, for receivers on several hosts.

Every key starts with the caller's prefix (the rules of the token store: restrict the
Redis user to ``~<prefix>*``). Per message ``<prefix>cb:m:<reference>`` (a hash: status,
rank, channel, number, campaign, first and last event time, event count),
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

from .._fleet.connection import DEFAULT_KEY_PREFIX, RedisClient, check_prefix, redacted_url
from ._events import DeliveryEvent, number_key
from ._status import DeliveryStatus
from ._store import MessageState, event_row, stored_event, utc

__all__ = ["RedisDeliveryStore"]

#: Entries the change stream keeps (approximately): a reader further behind misses some.
DEFAULT_LOG_LENGTH: Final = 1_000_000

# ARGV: prefix, log length, then 11 values per event (see _arguments). "" is "none".
_WRITE: Final = """
local p = ARGV[1]
local maxlen = ARGV[2]
local function counts(campaign)
  if campaign == '' then return p .. 'cb:c:-' end
  return p .. 'cb:c:=' .. campaign
end
for i = 3, #ARGV, 11 do
  local ref, key, digits, number, campaign = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4]
  local status, rank, channel = ARGV[i+5], tonumber(ARGV[i+6]), ARGV[i+7]
  local at_text, received, body = ARGV[i+8], ARGV[i+9], ARGV[i+10]
  local at = tonumber(at_text)
  if redis.call('SADD', p .. 'cb:k:' .. ref, key) == 1 then
    redis.call('RPUSH', p .. 'cb:e:' .. ref, key .. '\\n' .. received .. '\\n' .. body)
    local m = p .. 'cb:m:' .. ref
    local cur = redis.call('HMGET', m, 'r', 's', 'c', 'n', 'g', 'f', 'l')
    if not cur[1] then
      redis.call('HSET', m, 's', status, 'r', rank, 'c', channel, 'n', number,
                 'g', campaign, 'f', at_text, 'l', at_text, 'k', 1)
      if digits ~= '' then redis.call('SADD', p .. 'cb:n:' .. digits, ref) end
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
        if digits ~= '' then redis.call('SADD', p .. 'cb:n:' .. digits, ref) end
      end
      if at < tonumber(cur[6]) then redis.call('HSET', m, 'f', at_text) end
      if at > tonumber(cur[7]) then redis.call('HSET', m, 'l', at_text) end
      redis.call('HINCRBY', m, 'k', 1)
    end
    redis.call('XADD', p .. 'cb:log', 'MAXLEN', '~', maxlen, '*',
               'k', key, 't', received, 'b', body)
  end
end
return 0
"""


class RedisDeliveryStore:
    """Delivery state in Redis: for a fleet of receivers behind one callback URL.

    Args:
        redis_url: ``redis://[[user]:password@]host[:port][/db]`` (or ``rediss://``).
        key_prefix: every key starts with it (as for `RedisTokenStore`).
        log_length: about how many events the change stream keeps.

    Raises:
        ConfigurationError: the redis extra is not installed, or a bad argument.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        log_length: int = DEFAULT_LOG_LENGTH,
    ) -> None:
        self._redis = RedisClient(redis_url, "RedisDeliveryStore")
        self.key_prefix = check_prefix(key_prefix)
        self.log_length = log_length
        self._script: Any = None

    def __repr__(self) -> str:
        url = redacted_url(self._redis.url)
        return f"<RedisDeliveryStore {url!r} key_prefix={self.key_prefix!r}>"

    async def open(self) -> None:
        """Check that Redis answers."""
        client = self._redis.get()
        await client.ping()
        self._script = client.register_script(_WRITE)

    async def write(self, events: Sequence[DeliveryEvent], received_at: float) -> None:
        """Store *events* in one atomic script."""
        arguments: list[str | bytes | int | float] = [self.key_prefix, self.log_length]
        for event in events:
            row = event_row(event, received_at)
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
        if len(arguments) > 2:
            await self._script(keys=[], args=arguments, client=self._redis.get())

    async def message(self, reference: str) -> MessageState | None:
        """The state of one message, or None."""
        found = await self._client().hgetall(self._key("m", reference))
        return _state(reference, found) if found else None

    async def messages_for(
        self, number: str, campaign_name: str | None = None
    ) -> list[MessageState]:
        """The messages of *number* (any formatting), oldest first."""
        client = self._client()
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
        entries = await self._client().lrange(self._key("e", reference), 0, -1)
        events = []
        for entry in entries:
            key, received, body = entry.split(b"\n", 2)
            events.append(stored_event(body, key.decode(), float(received)))
        return events

    async def counts(self, campaign_name: str | None) -> dict[DeliveryStatus, int]:
        """Messages of a campaign by status."""
        name = "-" if not campaign_name else f"={campaign_name}"
        found = await self._client().hgetall(f"{self.key_prefix}cb:c:{name}")
        counts = {DeliveryStatus(k.decode()): int(v) for k, v in found.items()}
        return {status: count for status, count in counts.items() if count > 0}

    async def changes(self, after: str | None, limit: int) -> tuple[list[DeliveryEvent], str]:
        """Events stored after stream id *after*, and the id of the last one."""
        client = self._client()
        log = f"{self.key_prefix}cb:log"
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
        """Close the connections to Redis."""
        await self._redis.aclose()

    def _client(self) -> Any:
        # redis-py's asyncio methods are typed as maybe-awaitable: Any spares a cast per call.
        return self._redis.get()

    def _key(self, kind: str, name: str) -> str:
        return f"{self.key_prefix}cb:{kind}:{name}"


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
