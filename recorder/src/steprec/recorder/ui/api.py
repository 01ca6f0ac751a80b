"""`/api/`: the browser's reads as JSON, for scripts, with the pages' parameters and checks.

Times stay Unix nanoseconds (`*_ns`), as in the query service; a page's next-page token or offset is in the
answer, so a script pages the way the page does.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..querier.sql import SqlBusy, SqlRefused, SqlTimeout
from . import views
from .pages import run_filters
from .params import BadRequest, Params, run_id


async def runs(request: Request) -> Response:
    params = Params(request.query_params, ("agent", "conversation", "outcome", "since", "until", "after"))
    filters = run_filters(params)
    return JSONResponse(await views.runs_page(request.app.state.store, filters, params.page_token("after")))


async def run(request: Request) -> Response:
    params = Params(request.query_params, ("snapshot", "page"))
    data = await views.run_page(
        request.app.state.store,
        run_id(request.path_params["run_id"]),
        params.optional_integer("snapshot", low=0, high=2**31 - 1),
        params.optional_integer("page", low=1, high=2**31 - 1),
    )
    data["commands"] = views.commands(data["run"], data["snapshot"], data["continue_index"], request.app.state.endpoint)
    return JSONResponse(data)


async def below(request: Request) -> Response:
    params = Params(request.query_params, ("offset",))
    offset = params.integer("offset", default=0, low=0, high=10**9)
    return JSONResponse(await views.tree_level(request.app.state.store, run_id(request.path_params["run_id"]), offset))


async def conversations(request: Request) -> Response:
    params = Params(request.query_params, ("offset",))
    offset = params.integer("offset", default=0, low=0, high=10**9)
    return JSONResponse(await views.conversations_page(request.app.state.store, offset))


async def recovery(request: Request) -> Response:
    params = Params(request.query_params, ("after",))
    return JSONResponse(await views.recovery_page(request.app.state.store, params.page_token("after")))


async def sql(request: Request) -> Response:
    """`?q=` as JSON rows (`format=json`, the first 500) or the whole result as `csv` or `parquet`."""
    params = Params(request.query_params, ("q", "format"))
    shape = params.choice("format", ("json", "csv", "parquet")) or "json"
    try:
        table, truncated = await views.sql_table(
            request.app.state.store, request.app.state.sql_slots, request.query_params.get("q", "")
        )
    except SqlBusy as busy:
        return JSONResponse({"error": str(busy)}, status_code=503)
    except (SqlRefused, SqlTimeout) as refused:
        raise BadRequest(str(refused)) from None
    if shape == "csv":
        return Response(views.as_csv(table), media_type="text/csv; charset=utf-8", headers=_attachment("result.csv"))
    if shape == "parquet":
        return Response(views.as_parquet(table), media_type="application/vnd.apache.parquet",
                        headers=_attachment("result.parquet"))  # fmt: skip
    result = views.shown_rows(table, truncated)
    return JSONResponse({"columns": result.columns, "rows": result.rows, "truncated": result.truncated})


def _attachment(name: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="{name}"'}
