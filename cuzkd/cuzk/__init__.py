"""cuzk's own interfaces: its gRPC service (``proving.proto`` and the modules generated from it)
and cuzkd's client of it.

The generated ``proving_pb2`` is committed (``scripts/gen-cuzk-proto.sh`` regenerates it; a test
checks the committed files are what the pinned grpcio-tools makes of the ``.proto``).
"""
