"""The FastAPI app a replica serves: the sync protocol, completions, accepts and cancels, behind a bearer token.

Every route but /health wants `Authorization: Bearer <token>` (401 otherwise), and every route under a workspace
its editor's key (protocol.KEY_HEADER; 400 without one): a workspace is found by its id and its key, so another
key names another workspace (workspaces.Owner). A body past its route's size is a 413, one that does not
validate a 422 (edge.py: one sentence, never the input), token ids outside the vocabulary a 422, another tokenizer
a 409: none of them touches a workspace. Blocking work (a snapshot into the datastore, creating a workspace) runs
in a thread. Each request to a workspace's route runs with workspaces.CURRENT_WORKSPACE set: its log lines name
the workspace. A snapshot may also come in chunks (uploads.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from typing import Callable

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from rest_lsp.team import edge
from rest_lsp.team.protocol import (API, KEY_HEADER, KEY_PATTERN, WORKSPACE_ID_CHARS, AcceptRequest, CancelRequest,
                                    CompleteReply, CompleteRequest, Delta, DraftsRequest, Events, Problem, Snapshot,
                                    SyncReply, TokenizerReply)
from rest_lsp.auth import bearer_matches
from rest_lsp.team.uploads import Uploads, chunk_routes
from rest_lsp.team.workspaces import CURRENT_WORKSPACE, BadTokens, Owner, SyncRefused, Workspaces

log = logging.getLogger(__name__)


class Replica:
    """What the routes serve: the workspaces, the token, this replica's name (in every answer, for logs and tests)."""

    def __init__(self, workspaces: Workspaces, token: str, name: str, uploads: Uploads | None = None):
        self.workspaces, self.token, self.name = workspaces, token, name
        self.uploads = uploads if uploads is not None else Uploads()


def create_app(replica: Callable[[], Replica]) -> FastAPI:
    """The app; `replica()` gives the state (in Serve, the replica process installs it after the app is built)."""
    app = FastAPI(title="rest-lsp team server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.replica = replica
    app.add_middleware(WorkspaceContext)
    app.add_middleware(edge.BodyLimit)  # outermost: a body past its limit is refused before anything reads it
    app.add_exception_handler(RequestValidationError, edge.invalid_request)
    app.add_exception_handler(ValidationError, edge.invalid_model)

    @app.exception_handler(BadTokens)
    async def bad_tokens(request: Request, err: BadTokens):
        return JSONResponse({"detail": str(err)}, status_code=422)

    @app.exception_handler(SyncRefused)
    async def refused(request: Request, err: SyncRefused):
        return JSONResponse(Problem(detail=str(err), kind="tokenizer").model_dump(), status_code=409)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    api = APIRouter(prefix=API, dependencies=[Depends(_authorized)])
    _sync_routes(api)
    _work_routes(api)
    chunk_routes(api, owned, _current, apply_snapshot)
    app.include_router(api)
    return app


def owned(request: Request,
          workspace: str = Path(min_length=WORKSPACE_ID_CHARS[0], max_length=WORKSPACE_ID_CHARS[1]),
          key: str | None = Header(default=None, alias=KEY_HEADER)) -> Owner:
    """The workspace a route names, as its editor's: its id and the key the request carries."""
    if key is None or not re.fullmatch(KEY_PATTERN, key):
        raise HTTPException(400, f"The {KEY_HEADER} header must hold the workspace's key: 32 to 128 characters of "
                                 "A-Z, a-z, 0-9, _ and -.")
    return Owner.of(workspace, key)


async def apply_snapshot(owner: Owner, body: Snapshot, r: Replica) -> SyncReply:
    """A snapshot into its workspace (made now if it is new), then the budget kept."""
    state, _ = await asyncio.to_thread(r.workspaces.get, owner)
    reply = await asyncio.to_thread(state.snapshot, body)
    await asyncio.to_thread(r.workspaces.trim)
    return reply.model_copy(update={"replica": r.name})


def _sync_routes(api: APIRouter) -> None:
    @api.get("/tokenizer")
    async def tokenizer(r: Replica = Depends(_current)) -> TokenizerReply:
        shared = r.workspaces.shared
        return TokenizerReply(key=shared.tokenizer_key, tokenizer=shared.tokenizer_blob,
                              split_special_tokens=shared.split_special_tokens, vocab_size=shared.vocab_size)

    @api.post("/workspaces/{workspace}/snapshot")
    async def snapshot(body: Snapshot, ws: Owner = Depends(owned), r: Replica = Depends(_current)) -> SyncReply:
        return await apply_snapshot(ws, body, r)

    @api.post("/workspaces/{workspace}/delta")
    async def delta(body: Delta, ws: Owner = Depends(owned), r: Replica = Depends(_current)) -> SyncReply:
        state = r.workspaces.find(ws)
        if state is None:
            return SyncReply(epoch=None, seq=0, need_snapshot=True, reason="unknown workspace", replica=r.name)
        reply = await asyncio.to_thread(state.delta, body)
        return reply.model_copy(update={"replica": r.name})

    @api.delete("/workspaces/{workspace}")
    async def close(ws: Owner = Depends(owned), r: Replica = Depends(_current)) -> dict:
        r.uploads.drop(ws)
        return {"dropped": await asyncio.to_thread(r.workspaces.drop, ws)}

    @api.post("/workspaces/{workspace}/events")
    async def events(body: Events, ws: Owner = Depends(owned), r: Replica = Depends(_current)) -> dict:
        state = r.workspaces.find(ws)
        if state is not None:
            state.events(body)
        return {"known": state is not None}


def _work_routes(api: APIRouter) -> None:
    @api.post("/workspaces/{workspace}/complete")
    async def complete(body: CompleteRequest, ws: Owner = Depends(owned),
                       r: Replica = Depends(_current)) -> CompleteReply:
        state, created = await asyncio.to_thread(r.workspaces.get, ws)
        if body.settings is not None:
            await asyncio.to_thread(state.apply_settings, body.settings)
        state.events(body.events)
        try:
            ticket = state.submit(body.request_id, body.doc_id, body.text, min(body.offset, len(body.text)))
        except ValueError as err:  # text no prompt can be built from (a lone surrogate): the editor's to fix
            raise HTTPException(422, str(err)) from None
        try:
            done = await asyncio.wrap_future(ticket.future)
        except asyncio.CancelledError:  # the client went away: stop the work
            ticket.cancel()
            raise
        finally:
            state.finished(body.request_id)
        need = created or state.epoch is None
        log.debug("completion %s: %s", body.request_id,
                  "none" if done is None else f"{done.tokens} tokens, {done.steps} steps, {done.latency_ms:.0f} ms")
        if done is None:
            return CompleteReply(need_snapshot=need, replica=r.name)
        return CompleteReply(text=done.text, id=done.id, source=done.source, tokens=done.tokens, steps=done.steps,
                             latency_ms=done.latency_ms, need_snapshot=need, replica=r.name)

    @api.post("/workspaces/{workspace}/cancel")
    async def cancel(body: CancelRequest, ws: Owner = Depends(owned), r: Replica = Depends(_current)) -> dict:
        state = r.workspaces.find(ws)
        return {"cancelled": state is not None and state.cancel(body.request_id)}

    @api.post("/workspaces/{workspace}/accept")
    async def accept(body: AcceptRequest, ws: Owner = Depends(owned), r: Replica = Depends(_current)) -> dict:
        state = r.workspaces.find(ws)
        ok = state is not None and await asyncio.to_thread(state.service.accept, body.id, body.text)
        return {"accepted": bool(ok)}

    @api.post("/workspaces/{workspace}/drafts")
    async def drafts(body: DraftsRequest, ws: Owner = Depends(owned), r: Replica = Depends(_current)) -> list:
        state = r.workspaces.find(ws)
        found = await asyncio.to_thread(state.service.drafts, body.text) if state is not None else []
        return [{"text": text, "weight": weight} for text, weight in found]

    @api.get("/workspaces/{workspace}/stats")
    async def stats(ws: Owner = Depends(owned), r: Replica = Depends(_current)) -> dict:
        state = r.workspaces.find(ws)
        out = await asyncio.to_thread(state.service.stats) if state is not None else {}
        return {**out, "replica": r.name, "pid": os.getpid(), "epoch": state.epoch if state else None,
                "seq": state.seq if state else 0}


class WorkspaceContext:
    """ASGI middleware: a request to /v1/workspaces/{workspace}/... runs with CURRENT_WORKSPACE set."""

    PREFIX = f"{API}/workspaces/"

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        workspace = path[len(self.PREFIX):].split("/", 1)[0] if path.startswith(self.PREFIX) else ""
        if not workspace:
            return await self.app(scope, receive, send)
        token = CURRENT_WORKSPACE.set(workspace)
        try:
            await self.app(scope, receive, send)
        finally:
            CURRENT_WORKSPACE.reset(token)


def _current(request: Request) -> Replica:
    return request.app.state.replica()


def _authorized(request: Request, authorization: str | None = Header(default=None)) -> None:
    if not bearer_matches(authorization, _current(request).token):
        raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
