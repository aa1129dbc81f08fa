"""How the workload's Kafka clients map librdkafka's errors to the outcomes
the history records (docs/chaos.md, "Kafka clients")."""

from __future__ import annotations

import pytest

from raftcoord.chaos.options import Options
from raftcoord.chaos.workload import _outcome_known
from raftcoord.client import FatalError, KafkaError, KafkaTimeoutError, TransactionAbortableError

confluent_kafka = pytest.importorskip("confluent_kafka")
from raftcoord.chaos.kafka_clients import error_of  # noqa: E402

Error = confluent_kafka.KafkaError


def test_a_fenced_producer_is_fatal() -> None:
    mapped = error_of(confluent_kafka.KafkaException(Error(Error._FENCED, fatal=True)))
    assert isinstance(mapped, FatalError)
    assert _outcome_known(mapped)


def test_an_abortable_error_is_refused_unless_its_cause_is_retriable() -> None:
    refused = error_of(Error(Error.INVALID_TXN_STATE, txn_requires_abort=True))
    assert isinstance(refused, TransactionAbortableError) and _outcome_known(refused)
    unknown = error_of(Error(Error.REQUEST_TIMED_OUT, txn_requires_abort=True, retriable=True))
    assert isinstance(unknown, TransactionAbortableError) and not _outcome_known(unknown)


@pytest.mark.parametrize(
    "code",
    [Error._TIMED_OUT, Error._TRANSPORT, Error.NOT_COORDINATOR, Error.COORDINATOR_NOT_AVAILABLE],
)
def test_timeouts_and_moving_coordinators_are_asked_again(code: int) -> None:
    mapped = error_of(Error(code))
    assert isinstance(mapped, KafkaTimeoutError) and not _outcome_known(mapped)


def test_other_errors_did_not_happen() -> None:
    mapped = error_of(Error(Error.TOPIC_AUTHORIZATION_FAILED))
    assert type(mapped) is KafkaError and _outcome_known(mapped)


def test_an_unknown_client_is_refused() -> None:
    with pytest.raises(ValueError, match="--client"):
        Options(seed=1, client_kind="java").check()
