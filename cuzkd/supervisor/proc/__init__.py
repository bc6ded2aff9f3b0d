"""OS processes: spawning, identity, the process tree, reaping, child table, output."""
