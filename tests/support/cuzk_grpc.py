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
                metrics: Callable[..., Any] | None = None) -> tuple[grpc.aio.Server, str]:
    """A gRPC server answering GetStatus with ``handler`` (its replies through
    ``serializer``) and, when given, GetMetrics with ``metrics``."""
    server = grpc.aio.server()
    methods = {"GetStatus": grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=pb.GetStatusRequest.FromString,
        response_serializer=serializer)}
    if metrics is not None:
        methods["GetMetrics"] = grpc.unary_unary_rpc_method_handler(
            metrics, request_deserializer=pb.GetMetricsRequest.FromString,
            response_serializer=pb.GetMetricsResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "cuzk.v1.ProvingEngine", methods),))
    address = f"unix://{tmp_path}/cuzk.sock"
    server.add_insecure_port(f"unix:{tmp_path}/cuzk.sock")
    await server.start()
    return server, address
