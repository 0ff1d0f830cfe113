import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel

import dispatch_async as da

log = logging.getLogger(__name__)


class Dispatch:
    """The app's one session, opened and closed with the app, as a typed dependency."""

    def __init__(self) -> None:
        self._session: da.DispatchSession | None = None

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        async with da.DispatchSession.from_env() as session:
            # A refused secret or address fails the start-up, not the first request.
            await session.check_credentials()
            # A request has 2 s per attempt, one retry and 5 s in all; the token,
            # the connections and the rate limit stay the session's.
            self._session = session.with_options(
                timeout=2.0, retry=da.RetryPolicy(attempts=2, max_time=5.0), deadline=5.0
            )
            yield
            self._session = None

    def __call__(self) -> da.DispatchSession:
        if self._session is None:
            raise RuntimeError("the app is not running")
        return self._session


dispatch = Dispatch()
app = FastAPI(lifespan=dispatch.lifespan)
Session = Annotated[da.DispatchSession, Depends(dispatch)]


class Reminder(BaseModel):
    number: str
    pix_code: str


class Sent(BaseModel):
    message_id: str


@app.post("/reminders", status_code=201)
async def send_reminder(reminder: Reminder, session: Session) -> Sent:
    recipient = {"number": reminder.number, "vars": {"pixCode": reminder.pix_code}}
    try:
        result = await session.send_template([recipient], template_id="pix_reminder")
    except da.InputError as error:  # an empty number, say: nothing was sent
        raise HTTPException(422, detail=str(error)) from error
    except (da.AuthenticationError, da.NetworkConfigurationError) as error:
        # Our secret was refused, or the way to the service is set up wrong: wake someone up.
        log.critical("the dispatch service cannot be used as configured: %s", error)
        raise HTTPException(502, detail="messaging is misconfigured") from error
    except da.TokenUnavailableError as error:  # the service's login cannot be reached
        raise HTTPException(503, detail="messaging is unavailable") from error
    if result.valid:
        return Sent(message_id=result.valid[0].id)
    if result.invalid:  # the service refused the number
        raise HTTPException(422, detail=f"not deliverable: {result.invalid[0].reason}")
    [failure] = result.failed
    problem = failure.error
    if failure.maybe_sent:  # it may have gone out: do not invite a retry
        status = 504 if isinstance(problem, TimeoutError) else 502
        raise HTTPException(status, detail="the message may have been sent")
    if isinstance(problem, da.ClientStatusError) and not isinstance(problem, da.RateLimitedError):
        log.error("the dispatch service refused the request: %s", problem)  # a bad template id?
        raise HTTPException(502, detail="messaging refused the request")
    # Certainly not sent (unreachable, overloaded, out of time): safe to try again.
    wait: float | None = getattr(problem, "retry_after", None)
    headers = {"Retry-After": str(round(wait or 30))}
    raise HTTPException(503, detail="not sent; try again later", headers=headers)
