"""Binary swaps: the release store, the release history, the rolling swap, its canary analysis."""
