"""The door's wire reader reads what protobuf reads: held to ``proving_pb2`` on messages protobuf
writes and on odd bytes, and never copies a payload."""

from __future__ import annotations

import tracemalloc
from typing import TypeVar

from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from support.protowire import length_delimited, tag, varint

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.wire import MAX_FIELDS, ProveCall, ProveResult, read_call, read_result

M = TypeVar("M", pb.ProveRequest, pb.ProveResponse)
_U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
_ENUM = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)


def _parsed(message: type[M], data: bytes) -> M | None:
    try:
        return message.FromString(data)
    except DecodeError:
        return None


def _call_of(message: pb.ProveRequest) -> ProveCall:
    submit = message.submit
    return ProveCall(submit.request_id, submit.proof_kind, submit.priority)


def _result_of(message: pb.ProveResponse) -> ProveResult:
    r = message.result
    return ProveResult(r.status, r.queue_wait_ms, r.srs_load_ms, r.synthesis_ms,
                       r.gpu_compute_ms, r.total_ms)


@settings(max_examples=60, deadline=None)
@given(request_id=st.text(max_size=40), kind=_ENUM, priority=_ENUM,
       payload=st.binary(max_size=300), proofs=st.lists(st.binary(max_size=40), max_size=3),
       sector=_U64, partition=st.integers(min_value=0, max_value=(1 << 32) - 1))
def test_a_request_protobuf_writes_reads_as_protobuf_reads_it(
        request_id: str, kind: int, priority: int, payload: bytes, proofs: list[bytes],
        sector: int, partition: int) -> None:
    message = pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id=request_id, proof_kind=kind, priority=priority, vanilla_proof=payload,
        vanilla_proofs=proofs, sector_number=sector, partition_index=partition,
        randomness=payload[:32]))
    assert read_call(message.SerializeToString()) == _call_of(message)


@settings(max_examples=60, deadline=None)
@given(status=_ENUM, timings=st.lists(_U64, min_size=5, max_size=5),
       proof=st.binary(max_size=300), error=st.text(max_size=40))
def test_a_reply_protobuf_writes_reads_as_protobuf_reads_it(
        status: int, timings: list[int], proof: bytes, error: str) -> None:
    message = pb.ProveResponse(result=pb.AwaitProofResponse(
        job_id="j", status=status, proof=proof, error_message=error,
        queue_wait_ms=timings[0], srs_load_ms=timings[1], synthesis_ms=timings[2],
        gpu_compute_ms=timings[3], total_ms=timings[4]))
    assert read_result(message.SerializeToString()) == _result_of(message)


# Fields as a caller other than protobuf may write them: each is a field of SubmitProofRequest
# (inside a submit) or of ProveRequest, with the wire type it has or another.
_SUBMIT_FIELDS = st.sampled_from([
    length_delimited(1, b"id-a"), length_delimited(1, b"id-b"), length_delimited(1, b""),
    tag(2, 0) + varint(1), tag(2, 0) + varint(4), tag(2, 0) + varint(0),
    tag(2, 0) + varint(99), tag(2, 0) + varint((1 << 64) - 1),
    tag(5, 0) + varint(3), tag(5, 0) + varint(4), tag(5, 0) + varint(1 << 40),
    length_delimited(2, b"\x01"), tag(5, 5) + b"\x01\x00\x00\x00",  # wrong wire types
    length_delimited(10, b"payload" * 20), length_delimited(11, b"p"),
    tag(3, 0) + varint(1 << 35), tag(23, 1) + bytes(8), length_delimited(999, b"x"),
])


@settings(max_examples=200, deadline=None)
@given(submits=st.lists(st.lists(_SUBMIT_FIELDS, max_size=6), max_size=3),
       outer=st.lists(st.sampled_from([length_delimited(7, b"zz"), tag(2, 0) + b"\x05",
                                       tag(1, 0) + b"\x01"]), max_size=2))
def test_repeated_unknown_and_mistyped_fields_read_as_protobuf_reads_them(
        submits: list[list[bytes]], outer: list[bytes]) -> None:
    data = b"".join(outer) + b"".join(length_delimited(1, b"".join(fields))
                                      for fields in submits)
    assert read_call(data) == _call_of(pb.ProveRequest.FromString(data))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_protobuf_reads_are_read_alike_and_nothing_raises(data: bytes) -> None:
    call, result = read_call(data), read_result(data)
    if (request := _parsed(pb.ProveRequest, data)) is not None:
        assert call is None or call == _call_of(request)
    if (reply := _parsed(pb.ProveResponse, data)) is not None:
        assert result is None or result == _result_of(reply)


def test_bytes_that_cannot_be_walked_are_none() -> None:
    submit = length_delimited(1, b"id") + tag(2, 0) + varint(1)
    for data in (
        tag(1, 2) + varint(len(submit) + 5) + submit,  # runs past the end
        tag(1, 2) + varint(3) + tag(2, 0) + b"\xff\xff",  # truncated varint inside
        b"\x80" * 11,  # over-long varint
        tag(0, 0) + b"\x01",  # field number 0
        tag(3, 3) + tag(3, 4),  # a group
        tag(4, 6),  # wire type 6
        length_delimited(1, length_delimited(1, b"\xff\xfe")),  # request_id not UTF-8
    ):
        assert read_call(data) is None, data
    assert read_result(tag(1, 2) + b"\x05\x10") is None


def test_a_51_mb_request_is_read_without_copying_its_payload() -> None:
    payload = bytes(51_000_000)
    data = pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id="porep-1", proof_kind=pb.POREP_SEAL_COMMIT, priority=pb.HIGH,
        vanilla_proof=payload)).SerializeToString()
    del payload
    tracemalloc.start()
    try:
        call = read_call(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert call == ProveCall("porep-1", pb.POREP_SEAL_COMMIT, pb.HIGH)
    assert peak < 64_000, peak


def test_a_flood_of_fields_is_refused_after_max_fields_not_walked_to_its_end() -> None:
    # a WindowPoSt with one vanilla proof per sector of a full partition is read
    proofs = [bytes(8)] * 2349
    post = pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id="w", proof_kind=pb.WINDOW_POST_PARTITION, priority=pb.HIGH,
        vanilla_proofs=proofs)).SerializeToString()
    assert read_call(post) == ProveCall("w", pb.WINDOW_POST_PARTITION, pb.HIGH)
    # 8 MB of two-byte fields: protobuf reads it, the walk stops at MAX_FIELDS
    flood = length_delimited(1, (tag(3, 0) + b"\x01") * 4_000_000 + tag(2, 0) + b"\x01")
    assert pb.ProveRequest.FromString(flood).submit.proof_kind == pb.POREP_SEAL_COMMIT
    assert read_call(flood) is None
    assert read_result(length_delimited(1, (tag(10, 0) + b"\x01") * (MAX_FIELDS + 1))) is None
