"""The client's error vocabulary: every protocol error code maps to exactly one
exception class, and each class is in the right reaction group."""

from __future__ import annotations

import pytest

from raftcoord.client import errors
from raftcoord.client.errors import (
    CODE_CLASSES,
    FatalError,
    KafkaError,
    RetriableError,
    TransactionAbortableError,
    error_for,
)
from raftcoord.protocol.v1 import common_pb2

CODES = dict(common_pb2.ErrorCode.items())
ERROR_CODES = {name: value for name, value in CODES.items() if name != "NONE"}


def all_error_classes() -> list[type[KafkaError]]:
    found: list[type[KafkaError]] = []
    pending: list[type[KafkaError]] = [KafkaError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("name", sorted(ERROR_CODES))
def test_every_error_code_maps_to_its_own_class(name: str) -> None:
    code = ERROR_CODES[name]
    error = error_for(code, f"detail of {name}")
    assert type(error) is CODE_CLASSES[code]
    assert type(error).code == code
    assert isinstance(error, KafkaError)


def test_the_mapping_is_one_to_one_and_covers_the_enum() -> None:
    assert set(CODE_CLASSES) == set(ERROR_CODES.values())
    assert len(set(CODE_CLASSES.values())) == len(CODE_CLASSES)
    # No class outside the mapping claims a code of its own.
    claimed = [c for c in all_error_classes() if "code" in c.__dict__ and c.code is not None]
    assert sorted(claimed, key=lambda c: c.__name__) == sorted(
        CODE_CLASSES.values(), key=lambda c: c.__name__
    )


def test_none_is_not_an_error() -> None:
    assert common_pb2.NONE not in CODE_CLASSES
    with pytest.raises(ValueError, match="NONE"):
        error_for(common_pb2.NONE, "")


def test_error_for_keeps_the_message() -> None:
    error = error_for(common_pb2.PRODUCER_FENCED, "epoch 3 is older than 4")
    assert error.message == "epoch 3 is older than 4"
    assert str(error) == "epoch 3 is older than 4"
    # Without a message the code's name says what happened.
    assert str(error_for(common_pb2.CONCURRENT_TRANSACTIONS)) == "CONCURRENT_TRANSACTIONS"


def test_an_unknown_code_from_a_newer_server_is_an_unknown_server_error() -> None:
    error = error_for(9999, "something new")
    assert type(error) is errors.UnknownServerError
    assert "9999" in str(error) and "something new" in str(error)


RETRIABLE = {
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "CONCURRENT_TRANSACTIONS",
    "REQUEST_TIMED_OUT",
    "NOT_LEADER_OR_FOLLOWER",
    "LEADER_NOT_AVAILABLE",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "UNKNOWN_TOPIC_OR_PARTITION",
    "UNSTABLE_OFFSET_COMMIT",
    "KAFKA_STORAGE_ERROR",
}
FATAL = {
    "PRODUCER_FENCED",
    "INVALID_PRODUCER_EPOCH",
    "INVALID_TXN_STATE",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
}
ABORTABLE = {"TRANSACTION_ABORTABLE", "UNKNOWN_PRODUCER_ID", "INVALID_PRODUCER_ID_MAPPING"}


@pytest.mark.parametrize("name", sorted(ERROR_CODES))
def test_reaction_classes_follow_the_design(name: str) -> None:
    """Kafka's reaction classes: retriable / abortable / fatal; everything else is
    none of the three (the caller decides)."""
    error = error_for(ERROR_CODES[name])
    assert isinstance(error, RetriableError) == (name in RETRIABLE)
    assert error.retriable == (name in RETRIABLE)
    assert isinstance(error, FatalError) == (name in FATAL)
    assert isinstance(error, TransactionAbortableError) == (name in ABORTABLE)


def test_the_three_groups_do_not_overlap() -> None:
    for cls in all_error_classes():
        groups = [
            issubclass(cls, g) for g in (RetriableError, FatalError, TransactionAbortableError)
        ]
        assert sum(groups) <= 1, cls


def test_client_side_errors_have_no_code() -> None:
    for cls in (
        errors.KafkaTimeoutError,
        errors.KafkaConnectionError,
        errors.IllegalStateError,
        errors.TransactionAbortedError,
    ):
        assert cls.code is None
    assert issubclass(errors.KafkaTimeoutError, RetriableError)
    assert issubclass(errors.KafkaConnectionError, RetriableError)
    assert not issubclass(errors.IllegalStateError, RetriableError)


def test_again_makes_a_fresh_error_of_the_same_class() -> None:
    error = errors.ProducerFencedError("fenced by epoch 5")
    again = error.again()
    assert type(again) is errors.ProducerFencedError and again is not error
    assert again.message == error.message


def test_every_exported_name_exists() -> None:
    for name in errors.__all__:
        assert hasattr(errors, name), name
