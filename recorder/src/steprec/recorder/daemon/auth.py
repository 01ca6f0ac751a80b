"""The guards in front of every servicer: a bearer token, and a request that parses.

Health stays open so an orchestrator (Docker, Kubernetes) can probe the
recorder without holding the secret. The token is compared in constant time
and never logged.
"""

from __future__ import annotations

import hmac
import inspect

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


class ReadableRequests(grpc.aio.ServerInterceptor):
    """Parses each unary request before its servicer, refusing bytes that are not the method's request message.

    grpc's own deserializer turns them into UNKNOWN ("Unexpected DecodeError") and logs a traceback per call,
    so a stranger's garbage reads like a recorder fault. Here it gets INVALID_ARGUMENT and the reason, as
    Export already does (ingest.py). A client-streamed upload (SaveConversation) has each message parsed as
    it is read; bidirectional streams (reflection) and plain-function servicers pass unchanged.
    """

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse, method = handler.request_deserializer, handler_call_details.method

        async def parsed(payload: bytes, context: grpc.aio.ServicerContext):
            try:
                return parse(payload)
            except Exception as error:  # DecodeError, or whatever else a deserializer raises on bad bytes
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not one {method} reads: {error}")

        if handler.request_streaming:
            return _parsing_uploads(handler, parsed)

        if not handler.response_streaming:
            behavior = handler.unary_unary
            if not inspect.iscoroutinefunction(behavior):
                return handler

            async def unary(payload: bytes, context: grpc.aio.ServicerContext):
                return await behavior(await parsed(payload, context), context)

            return grpc.unary_unary_rpc_method_handler(unary, response_serializer=handler.response_serializer)
        behavior = handler.unary_stream
        if inspect.isasyncgenfunction(behavior):

            async def stream(payload: bytes, context: grpc.aio.ServicerContext):
                async for response in behavior(await parsed(payload, context), context):
                    yield response

        elif inspect.iscoroutinefunction(behavior):  # writes its answers with context.write (health's Watch)

            async def stream(payload: bytes, context: grpc.aio.ServicerContext):
                return await behavior(await parsed(payload, context), context)

        else:
            return handler
        return grpc.unary_stream_rpc_method_handler(stream, response_serializer=handler.response_serializer)


def _parsing_uploads(handler: grpc.RpcMethodHandler, parsed) -> grpc.RpcMethodHandler:
    """A client-streaming handler whose servicer reads parsed requests, refused as `parsed` refuses them."""
    behavior = handler.stream_unary
    if handler.response_streaming or not inspect.iscoroutinefunction(behavior):
        return handler

    async def upload(payloads, context: grpc.aio.ServicerContext):
        async def requests():
            async for payload in payloads:
                yield await parsed(payload, context)

        return await behavior(requests(), context)

    return grpc.stream_unary_rpc_method_handler(upload, response_serializer=handler.response_serializer)
