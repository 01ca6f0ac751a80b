"""Bearer-token authentication for every call but health checks.

Health stays open so an orchestrator (Docker, Kubernetes) can probe the
recorder without holding the secret. The token is compared in constant time
and never logged.
"""

from __future__ import annotations

import hmac

import grpc

_OPEN_SERVICES = ("/grpc.health.v1.Health/",)


def _deny(details: str) -> grpc.RpcMethodHandler:
    async def refuse(request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, details)

    return grpc.unary_unary_rpc_method_handler(refuse)


class TokenAuth(grpc.aio.ServerInterceptor):
    """Refuses calls whose `authorization` metadata is not `Bearer <token>`."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        if handler_call_details.method.startswith(_OPEN_SERVICES):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        supplied = metadata.get("authorization")
        if supplied is None:
            return _deny("this recorder requires a token: send 'authorization: Bearer <token>'")
        if not hmac.compare_digest(str(supplied).encode(), self._expected):
            return _deny("the token is not valid for this recorder")
        return await continuation(handler_call_details)
