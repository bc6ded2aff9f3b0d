"""cuzk's kind names (:mod:`cuzkd.kinds`): every spelling of a kind becomes cuzk's name.

cuzk's ``/status`` says ``porep-c2``, its gRPC metrics ``porep_c2``, cuzkd's files and scripts
written before the rename ``porep``: one kind, so one label value. Only the old names are a
person's to change (a warning); gRPC's spelling is cuzk's own (none); an unknown kind is
another engine's and is kept as sent.
"""

from __future__ import annotations

import pytest

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.errors import KindTwice
from cuzkd.kinds import ProofKind, deprecation, enum_kind, normalise_kind, typed_table

#: each kind: cuzk's name, gRPC's spelling, cuzkd's old name
NAMES = [
    ("porep-c2", "porep_c2", "porep"),
    ("snap-update", "snap_update", "snap"),
    ("window-post", "window_post", "wpost"),
    ("winning-post", "winning_post", "winning"),
]
#: (text, cuzk's name, warned)
SPELLINGS = [(text, name, text == old) for name, grpc, old in NAMES for text in (name, grpc, old)]


@pytest.mark.parametrize(("text", "name", "warned"), SPELLINGS)
def test_every_spelling_of_a_kind_is_cuzks_name(text: str, name: str, warned: bool) -> None:
    assert normalise_kind(text) == name
    warning = deprecation(text)
    assert (warning is not None) == warned
    if warning is not None:
        assert repr(text) in warning and repr(name) in warning


def test_the_four_names_are_cuzks() -> None:
    assert [str(kind) for kind in ProofKind] == [name for name, _, _ in NAMES]


@pytest.mark.parametrize("text", ["proofshare", "PoRep", "porep-c1", "", "snap "])
def test_an_unknown_kind_is_kept_as_sent_without_a_warning(text: str) -> None:
    assert normalise_kind(text) == text
    assert deprecation(text) is None


def test_a_typed_table_is_keyed_by_cuzks_names_with_a_warning_per_old_key() -> None:
    table, warnings = typed_table({"winning": 15, "window_post": 60, "mine": 1})
    assert table == {"winning-post": 15, "window-post": 60, "mine": 1}
    assert list(warnings) == ["winning"]


@pytest.mark.parametrize(("table", "later", "first"), [
    ({"winning": 1, "winning-post": 2}, "winning-post", "winning"),
    ({"porep-c2": 1, "porep_c2": 2}, "porep_c2", "porep-c2"),
])
def test_two_spellings_of_one_kind_in_a_table_are_refused(
        table: dict[str, int], later: str, first: str) -> None:
    with pytest.raises(KindTwice) as caught:
        typed_table(table)
    assert caught.value.key == later
    assert repr(first) in str(caught.value)


def test_a_grpc_requests_kind_number_is_cuzks_name_or_other() -> None:
    # the proto's enum names, each the kind cuzk's /status calls it
    assert {pb.ProofKind.Name(n): enum_kind(n) for n in pb.ProofKind.values()} == {
        "PROOF_KIND_UNSPECIFIED": "other", "POREP_SEAL_COMMIT": "porep-c2",
        "SNAP_DEALS_UPDATE": "snap-update", "WINDOW_POST_PARTITION": "window-post",
        "WINNING_POST": "winning-post"}
    assert enum_kind(5) == enum_kind(-1) == "other"
