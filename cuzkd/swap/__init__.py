"""Binary swaps: the release store, the release history, the rolling swap and its canary analysis."""
