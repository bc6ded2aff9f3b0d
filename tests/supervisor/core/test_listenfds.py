"""What systemd passed and which door each socket is (core/listenfds), from plain values."""

from __future__ import annotations

from cuzkd.supervisor.core.listenfds import (
    Passed,
    PassedSocket,
    door_key,
    match,
    passed_fds,
    tcp_key,
    unix_key,
)

PID = 4242


def test_fds_start_at_3_and_are_named_in_order() -> None:
    env = {"LISTEN_PID": str(PID), "LISTEN_FDS": "2", "LISTEN_FDNAMES": "door:other"}
    assert passed_fds(env, PID) == Passed(fds=(3, 4), names=("door", "other"))


def test_names_that_do_not_fit_the_count_are_unknown() -> None:
    env = {"LISTEN_PID": str(PID), "LISTEN_FDS": "2", "LISTEN_FDNAMES": "door"}
    assert passed_fds(env, PID).names == ("unknown", "unknown")
    assert passed_fds({"LISTEN_PID": str(PID), "LISTEN_FDS": "1"}, PID).names == ("unknown",)


def test_fds_for_another_process_or_a_bad_count_are_not_taken() -> None:
    assert passed_fds({}, PID) == Passed()
    # a parent's variables leaked to us (its pid): the fds are not ours
    other = passed_fds({"LISTEN_PID": "1", "LISTEN_FDS": "1"}, PID)
    assert other.fds == () and "LISTEN_PID='1'" in other.ignored
    # "٣" is a digit to Python's int(); a million fds would be a million warnings
    for count in ("0", "-1", "two", "", "\u0663", "+1", " 1", "1000000"):
        bad = passed_fds({"LISTEN_PID": str(PID), "LISTEN_FDS": count}, PID)
        assert bad.fds == () and "LISTEN_FDS" in bad.ignored, count


def test_door_addresses_compare_as_the_sockets_are_bound() -> None:
    assert door_key("unix:///run/curio/cuzk.sock") == unix_key("/run/curio/cuzk.sock")
    assert door_key("unix:/run/curio//cuzk.sock") == unix_key("/run/curio/cuzk.sock")
    assert door_key("127.0.0.1:1234") == tcp_key("127.0.0.1", 1234)
    assert door_key("[::1]:1234") == tcp_key("::1", 1234)
    # systemd's ListenStream=PORT binds [::] (both families): a wildcard door is that one
    assert door_key("0.0.0.0:1234") == tcp_key("::", 1234) == ("tcp", "*", 1234)
    assert tcp_key("::ffff:127.0.0.1", 1234) == door_key("127.0.0.1:1234")
    assert door_key("localhost:1234") is None, "a name is never resolved"
    assert door_key("127.0.0.1:1235") != tcp_key("127.0.0.1", 1234)


def test_each_door_takes_the_socket_at_its_address_and_the_rest_is_reported() -> None:
    curio = PassedSocket(3, "door", unix_key("/run/curio/cuzk.sock"))
    stray = PassedSocket(4, "metrics", tcp_key("127.0.0.1", 9822))
    twin = PassedSocket(5, "again", unix_key("/run/curio/cuzk.sock"))
    not_listening = PassedSocket(6, "unknown", None)
    doors = ["unix:///run/curio/cuzk.sock", "127.0.0.1:7000"]
    found = match([curio, stray, twin, not_listening], doors)
    assert found.by_door == {"unix:///run/curio/cuzk.sock": curio}
    assert found.unused == (stray, twin, not_listening)
    assert found.unpassed == ("127.0.0.1:7000",)


def test_without_passed_sockets_every_door_binds_and_nothing_is_reported() -> None:
    found = match([], ["unix:///run/curio/cuzk.sock"])
    assert (dict(found.by_door), found.unused, found.unpassed) == ({}, (), ())
