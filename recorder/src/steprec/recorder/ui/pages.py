"""The HTML pages: each checks its parameters, asks `views` for its data and renders one template.

Templates autoescape everything (`app.py`), so text from models and tools is shown, never run.
"""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..querier.sql import SqlRefused, SqlTimeout
from . import access, views
from .params import OUTCOMES, BadRequest, Params, run_id


def _render(request: Request, template: str, status_code: int = 200, **context) -> Response:
    return request.app.state.templates.TemplateResponse(request, template, context, status_code=status_code)


def run_filters(params: Params) -> views.RunFilters:
    return views.RunFilters(
        agent_name=params.text("agent"),
        conversation_id=params.text("conversation"),
        outcome=params.choice("outcome", OUTCOMES),
        started_at_or_after_ns=params.instant_ns("since"),
        started_before_ns=params.instant_ns("until"),
    )


async def runs(request: Request) -> Response:
    params = Params(request.query_params, ("agent", "conversation", "outcome", "since", "until", "after"))
    filters = run_filters(params)
    page = await views.runs_page(request.app.state.store, filters, params.page_token("after"))
    form = {name: value for name, value in request.query_params.items() if name != "after"}
    older = urlencode({**form, "after": page["next"]}) if page["next"] else ""
    return _render(request, "runs.html", **page, form=form, older=older)


async def run(request: Request) -> Response:
    params = Params(request.query_params, ("snapshot", "page"))
    chosen = run_id(request.path_params["run_id"])
    data = await views.run_page(
        request.app.state.store,
        chosen,
        params.optional_integer("snapshot", low=0, high=2**31 - 1),
        params.optional_integer("page", low=1, high=2**31 - 1),
    )
    commands = views.commands(data["run"], data["snapshot"], data["continue_index"], request.app.state.endpoint)
    return _render(request, "run.html", **data, commands=commands)


async def tree(request: Request) -> Response:
    Params(request.query_params, ())
    data = await views.tree_root(request.app.state.store, run_id(request.path_params["run_id"]))
    return _render(request, "tree.html", **data)


async def conversations(request: Request) -> Response:
    params = Params(request.query_params, ("offset",))
    offset = params.integer("offset", default=0, low=0, high=10**9)
    return _render(request, "conversations.html", **await views.conversations_page(request.app.state.store, offset))


async def conversation(request: Request) -> Response:
    params = Params(request.query_params, ("page",))
    conversation_id = request.path_params["conversation_id"]
    if len(conversation_id) > 200 or not conversation_id.isprintable():
        raise BadRequest("a conversation id is printable text of at most 200 characters")
    data = await views.conversation_page(
        request.app.state.store, conversation_id, params.optional_integer("page", low=1, high=2**31 - 1)
    )
    return _render(request, "conversation.html", **data)


async def recovery(request: Request) -> Response:
    params = Params(request.query_params, ("after",))
    page = await views.recovery_page(request.app.state.store, params.page_token("after"))
    return _render(request, "recovery.html", **page)


async def sql(request: Request) -> Response:
    Params(request.query_params, ("q",))
    query = request.query_params.get("q", "")
    result = error = None
    if query.strip():
        try:
            table, truncated = await views.sql_table(request.app.state.store, request.app.state.sql_slots, query)
            result = views.shown_rows(table, truncated)
        except (SqlRefused, SqlTimeout) as refused:
            error = str(refused)
    return _render(request, "sql.html", status_code=400 if error else 200, query=query, result=result, error=error)


async def login(request: Request) -> Response:
    token = request.app.state.token
    if request.method == "GET":
        Params(request.query_params, ("next",))
        return _render(request, "login.html", next=access.safe_next(request.query_params.get("next")), error=None)
    try:
        form = await access.submitted_form(request)
    except ValueError as error:
        raise BadRequest(str(error)) from None
    target = access.safe_next(form.get("next"))
    if token is None:  # no token to sign in with: every page is open
        return RedirectResponse(target, status_code=303)
    if not token.matches(form.get("token", "")):
        return _render(request, "login.html", status_code=401, next=target, error="That token is not this recorder's.")
    return access.signed_in(target, form["token"], secure=request.url.scheme == "https")


async def logout(request: Request) -> Response:
    return access.signed_out()
