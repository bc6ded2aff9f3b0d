"""The engines: one runner per engine, the engine set, the releases they execute."""
