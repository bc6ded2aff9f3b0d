"""swap."""
