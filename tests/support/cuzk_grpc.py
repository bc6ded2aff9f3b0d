"""A gRPC server in the test's own event loop that answers cuzk's ``GetStatus`` (and, when
given, ``GetMetrics``) with handlers the test writes: to make an engine's gRPC misbehave."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from cuzkd.cuzk import proving_pb2 as pb


async def serve(tmp_path: Path, handler: Callable[..., Any],
                serializer: Callable[[Any], bytes] = lambda m: m.SerializeToString(),
                metrics: Callable[..., Any] | None = None, *, name: str = "cuzk",
                more: dict[str, grpc.RpcMethodHandler[Any, Any]] | None = None,
                ) -> tuple[grpc.aio.Server, str]:
    """A gRPC server at ``unix://{tmp_path}/{name}.sock`` answering GetStatus with
    ``handler`` (its replies through ``serializer``), when given GetMetrics with ``metrics``,
    and the methods of ``more`` (by method name: see :func:`method`)."""
    server = grpc.aio.server()
    methods = {"GetStatus": grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=pb.GetStatusRequest.FromString,
        response_serializer=serializer)}
    if metrics is not None:
        methods["GetMetrics"] = grpc.unary_unary_rpc_method_handler(
            metrics, request_deserializer=pb.GetMetricsRequest.FromString,
            response_serializer=pb.GetMetricsResponse.SerializeToString)
    methods.update(more or {})
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "cuzk.v1.ProvingEngine", methods),))
    address = f"unix://{tmp_path}/{name}.sock"
    server.add_insecure_port(f"unix:{tmp_path}/{name}.sock")
    await server.start()
    return server, address


def method(handler: Callable[..., Any], request: type[Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler for :func:`serve`'s ``more``: ``request`` is the method's request message."""
    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=request.FromString,
        response_serializer=lambda m: m.SerializeToString())
