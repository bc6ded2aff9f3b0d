"""The daemon: the composition root and what only it does (signals, reload, sd_notify)."""
