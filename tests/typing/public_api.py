"""Never run: mypy checks that the public API reads and types the way the docs show."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import aiohttp

import dispatch_async as da


async def quick_start(secret: str) -> None:
    async with da.DispatchSession(
        "https://api.example.com", client_secret=secret, account="acme"
    ) as session:
        result: da.DispatchResult = await session.send_template(
            [
                "+5511987654321",
                da.Recipient("+5511912345678", vars={"pixCode": "000201"}, ref=("row", 2)),
            ],
            template_id="pix_reminder",
            fallback=[da.Fallback.sms("Seu código Pix chegou")],
        )
        for msg in result.valid:
            ident: str = msg.id
            number: str = msg.number
            position: int = msg.position
            print(ident, number, position, msg.ref)
        for rejected in result.invalid:
            reason: str = rejected.reason
            print(rejected.number, reason, rejected.position + 1, rejected.ref)
        at: list[int] = [f.position for f in result.failed]
        print(at, [f.ref for f in result.failed])
        retry_these: list[da.Recipient] = [f.recipient for f in result.failed if not f.maybe_sent]
        print(retry_these, result.summary(), result.counts["valid"])
        result.raise_for_failures()
        templates: object = await session.list_templates()
        print(templates)


async def bulk(rows: list[dict[str, object]]) -> None:
    async with da.DispatchSession.from_env(chunk_size=1000, max_concurrency=8) as session:
        async with contextlib.aclosing(
            session.stream_basic(rows, text="Olá", deadline=60.0)
        ) as parts:
            async for part in parts:
                covered: range = part.positions
                print(covered.start, len(part.valid))
        await session.send_webhook(
            ["+5511987654321"],
            webhook="https://hooks.example.com",
            on_progress=lambda done, total: print(done, total),
            on_chunk=lambda part: print(len(part.valid)),
            retry_policy_is_not_an_option=True,  # type: ignore[call-arg]
        )


async def shared_http(http: aiohttp.ClientSession) -> None:
    policy = da.RetryPolicy(attempts=3, statuses=frozenset({429, 503, 500}))
    async with da.DispatchSession(
        "https://api.example.com",
        client_secret="s",
        http_session=http,
        retry=policy,
        timeout=aiohttp.ClientTimeout(total=10),
        requests_per_second=50,
    ) as session:
        try:
            await session.send_single(["+5511987654321"], text="x", account="other")
        except da.UnknownArgumentError as error:
            wrong: TypeError = error
            print(wrong)
        except da.AuthenticationError as error:
            partial: da.DispatchResult | None = error.result
            print(partial)
        except da.DispatchError as error:
            print(error.maybe_sent)


async def instrumented(registry: object) -> None:
    from dispatch_async import instrumentation

    def count_pauses(event: instrumentation.Event) -> None:
        if isinstance(event, instrumentation.Paused):
            print(event.status, event.seconds)

    hooks: list[instrumentation.Hook] = [
        count_pauses,
        instrumentation.LoggingHook(),
        instrumentation.OpenTelemetryHook(),
        instrumentation.PrometheusHook(registry),
    ]
    instrumentation.set_hooks(hooks)
    current: tuple[instrumentation.Hook, ...] = instrumentation.get_hooks()
    async with da.DispatchSession("https://api.example.com", client_secret="s", hooks=current):
        pass
    instrumentation.set_hooks(None)


def blocking(rows: list[dict[str, object]]) -> None:
    with da.DispatchClient.from_env(chunk_size=500) as client:
        result: da.DispatchResult = client.send_template(
            ["+5511987654321"], template_id="pix_reminder"
        )
        print(result.summary(), client.list_templates())
        quick: da.DispatchClient = client.with_options(
            timeout=2.0, retry=da.RetryPolicy(attempts=1), deadline=5.0
        )
        quick.send_basic(["+5511987654321"], text="x", account="other")
        with contextlib.closing(client.stream_basic(rows, text="Olá")) as parts:
            for part in parts:
                covered: range = part.positions
                print(covered)
        client.send_single(["+5511987654321"], text=1)  # type: ignore[arg-type]
    da.DispatchClient(
        "https://api.example.com",
        client_secret="s",
        http_session=None,  # type: ignore[call-arg]
    )


async def per_call_options(session: da.DispatchSession) -> None:
    web: da.DispatchSession = session.with_options(timeout=2.0, deadline=5.0)
    await web.send_basic(["+5511987654321"], text="x")
    session.with_options(chunk_size="big")  # type: ignore[arg-type]
    opted_out: da.DispatchSession = session.with_options(exclude=frozenset({"+5511912345678"}))
    await opted_out.send_basic(["+5511987654321"], text="x", exclude=lambda n: n.endswith("0"))
    reason: str = da.EXCLUDED_REASON
    print(reason)


async def learned_rate() -> None:
    from dispatch_async import instrumentation

    def show(event: instrumentation.Event) -> None:
        if isinstance(event, instrumentation.RateChanged):
            previous: float | None = event.previous
            print(event.requests_per_second, previous, event.reason, event.shared)

    async with da.DispatchSession(
        "https://api.example.com",
        client_secret="s",
        requests_per_second="auto",
        max_requests_per_second=200,
        hooks=[show],
    ) as session:
        rate: float | None = session.requests_per_second
        print(rate)
    fleet = da.RedisRateLimiter(
        "redis://127.0.0.1:6379/0", requests_per_second="auto", max_requests_per_second=500
    )
    learned: float | None = fleet.requests_per_second
    print(learned)
    # Any Redis: a URL of any form, or a client you built; the connection they share.
    address: da.SentinelAddress = da.parse_sentinel_url("redis+sentinel://h:26379/mymaster")
    service: str = address.service
    print(service)
    connection = da.RedisConnection("rediss://h:6379", ssl_ca_certs="/ca.pem")
    tag: str = connection.key_tag("acme:", "job:", "j1")
    clustered: bool | None = connection.cluster
    print(tag, clustered)
    da.RedisTokenStore(await connection.client(), key_prefix="acme:")
    da.RedisRateLimiter(connection.url, requests_per_second=5, max_redis_wait=10.0)
    await connection.aclose()
    da.DispatchSession("https://x", client_secret="s", requests_per_second="fast")  # type: ignore[arg-type]


async def testing_the_wire_and_the_waits() -> None:
    from dispatch_async.testing import FakeClock, FakeDispatchServer, RecordedRequest

    clock = FakeClock()
    as_a_clock: da.Clock = clock
    policy = da.RetryPolicy(clock=as_a_clock)
    wait: float = policy.wait_before(2, da.ConnectError("refused"))
    async with FakeDispatchServer(recorded_requests=10, recorded_body_bytes=1024) as server:
        received: list[RecordedRequest] = server.requests
        for request in received:
            endpoint: str | None = request.endpoint
            agent: str | None = request.headers.get("User-Agent")
            form: dict[str, str] | None = request.form
            print(request.method, request.path, request.size, request.json, endpoint, agent, form)
        server.clear_requests()
    slept: list[float] = clock.sleeps
    print(wait, slept, clock.now())


async def delivery_tracking(session: da.DispatchSession, body: bytes) -> None:
    from dispatch_async import callbacks

    event: callbacks.DeliveryEvent = callbacks.parse_event(body)
    status: callbacks.DeliveryStatus = event.status
    rank: int = status.rank
    print(event.reference, event.user_id, event.occurred_at, rank)
    store: callbacks.DeliveryStore = callbacks.RedisDeliveryStore("redis://127.0.0.1:6379/0")
    async with callbacks.CallbackServer(callbacks.DeliveryTracker(store)) as server:
        result = await session.send_basic(
            ["+5511987654321"], text="oi", campaign_name="job-1", callback=server.url
        )
        tracker = server.tracker
        await tracker.record(event)
        state: callbacks.MessageState | None = await tracker.message(event.reference)
        counts: dict[callbacks.DeliveryStatus, int] = await tracker.counts("job-1")
        print(state, counts)
        resolution = await callbacks.resolve_maybe_sent(result, tracker, campaign_name="job-1")
        confirmed: Sequence[da.ValidMessage] = resolution.confirmed
        print(confirmed, resolution.apply(result).counts)
        async for change in tracker:
            print(change.status)
    callbacks.CallbackReceiver(tracker, token=123)  # type: ignore[arg-type]


async def behind_a_company_network(secret: str) -> None:
    context = da.ssl_context("/etc/company/ca.pem", ca_dir="/etc/company/certs")
    async with da.DispatchSession(
        "https://api.example.com",
        client_secret=secret,
        proxy="http://user:password@proxy.example.com:3128",
        trust_env=False,
        ssl=context,
    ) as session:
        try:
            await session.check_credentials()
        except da.NetworkConfigurationError as error:
            host: str | None = error.host
            proxy: str | None = error.proxy
            print(host, proxy, error.maybe_sent)
    client = da.DispatchClient(
        "https://api.example.com", client_secret=secret, proxy="http://proxy:3128", ssl=context
    )
    client.close()
