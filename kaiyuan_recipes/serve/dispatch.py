"""A contract's requests to the one engine and their completions back, for both contracts: the engine's
refusals as answers (a full engine a 429, a stopping one a 503), and a client that leaves before its answer
cancels its requests (the engine drops their rows at its next step)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

from starlette.types import Receive

from .engine import Completion, EngineBusy, EngineStopped, GenerationEngine, Request
from .errors import APIError


def submit(engine: GenerationEngine, requests: list[Request]) -> list[Future]:
    """engine.submit_all with its refusals as answers: a 429 when it holds all it may, a 503 when it stops."""
    try:
        return engine.submit_all(requests)
    except EngineBusy as err:
        raise APIError(429, str(err), code="queue_full", headers={"Retry-After": "1"}) from None
    except EngineStopped as err:
        raise APIError(503, str(err), code="shutting_down") from None


async def client_gone(receive: Receive) -> None:
    """Returns once the client has disconnected (or the answer is complete: uvicorn then says the same)."""
    while (await receive())["type"] != "http.disconnect":  # bounded: the body was read, a disconnect is next
        pass


async def submitted(engine: GenerationEngine, requests: list[Request], receive: Receive) -> list[Completion]:
    """The requests' completions; a 503 when the engine stops before they are done. When the client leaves first
    (`receive`: its HTTP request's), the requests are cancelled, as a stream's are: the engine drops their rows at
    its next step and never scores them, and nothing is answered."""
    done = asyncio.gather(*map(asyncio.wrap_future, submit(engine, requests)))
    gone = asyncio.ensure_future(client_gone(receive))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            raise APIError(499, "the client closed the connection", code="client_closed")
        return done.result()
    except EngineStopped as err:
        raise APIError(503, str(err), code="shutting_down") from None
    finally:
        gone.cancel()
        for req in requests:  # answered, failed or abandoned: whatever of the call still runs stops
            req.cancelled.set()
        if not done.done():
            done.cancel()  # queued ones never start
            # its outcome (a CancelledError once the rows under way end) is nobody's: taken, not logged as lost
            done.add_done_callback(lambda gathered: gathered.cancelled() or gathered.exception())
