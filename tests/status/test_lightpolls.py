"""Which polls decode: the light-poll policy on its own, fed what each poll found."""

from __future__ import annotations

from cuzkd.status.lightpolls import DECODE_EVERY, LightPolls


def light_run(polls: LightPolls) -> int:
    """How many polls in a row only check the framing (each one's check holding)."""
    count = 0
    while polls.checks_only():
        polls.checked()
        count += 1
    return count


def test_plain_documents_are_always_decoded() -> None:
    polls = LightPolls()
    assert not polls.checks_only()
    polls.decoded(extensions=False)
    assert not polls.checks_only()


def test_documents_with_extensions_are_decoded_one_poll_in_decode_every() -> None:
    polls = LightPolls()
    polls.decoded(extensions=True)
    assert light_run(polls) == DECODE_EVERY - 1
    polls.decoded(extensions=True)
    assert light_run(polls) == DECODE_EVERY - 1


def test_a_broken_body_makes_the_following_polls_decode_until_extensions_decode_again() -> None:
    polls = LightPolls()
    polls.decoded(extensions=True)
    polls.checked()
    polls.broken()
    assert not polls.checks_only()
    polls.decoded(extensions=False)
    assert not polls.checks_only()
    polls.decoded(extensions=True)
    assert light_run(polls) == DECODE_EVERY - 1
