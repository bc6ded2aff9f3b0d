"""The HTTP faces: the control API on its 0600 socket, the read-only metrics listener."""
