"""The pure core: decisions from values and ``now`` (no asyncio, os, sockets or processes)."""
