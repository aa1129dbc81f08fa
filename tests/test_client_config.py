"""The clients' arguments: bootstrap addresses as Kafka's clients take them,
type and range checks that name the argument, and timeouts checked against
each other at construction (no sockets: nothing here reaches a node)."""

from __future__ import annotations

from typing import Any

import pytest

from raftcoord.client import Consumer, Producer, TransactionalProducer
from raftcoord.client._net import parse_bootstrap


@pytest.mark.parametrize(
    ("bootstrap", "addresses"),
    [
        ("h1:9092", ["h1:9092"]),
        ("h1:9092,h2:9093", ["h1:9092", "h2:9093"]),  # Kafka's bootstrap.servers
        (" h1:9092 , h2:9093 ,", ["h1:9092", "h2:9093"]),
        (["h1:9092", "h2:9093,h3:1"], ["h1:9092", "h2:9093", "h3:1"]),
        (("h1:9092", "h1:9092"), ["h1:9092"]),
        ("[::1]:9092", ["[::1]:9092"]),
    ],
)
def test_bootstrap_is_a_list_or_a_comma_separated_string(
    bootstrap: Any, addresses: list[str]
) -> None:
    assert parse_bootstrap(bootstrap) == addresses


@pytest.mark.parametrize("address", ["h1", "h1:", ":9092", "h1:port", "h1:0", "h1:65536"])
def test_a_malformed_bootstrap_address_is_named(address: str) -> None:
    with pytest.raises(ValueError, match=f"bootstrap address '{address}'"):
        parse_bootstrap(["ok:1", address])


@pytest.mark.parametrize("bootstrap", ["", " , ", []])
def test_an_empty_bootstrap_is_refused(bootstrap: Any) -> None:
    with pytest.raises(ValueError, match="at least one coordinator address"):
        parse_bootstrap(bootstrap)


@pytest.mark.parametrize("bootstrap", [9092, [b"h1:9092"], None])
def test_a_bootstrap_of_the_wrong_type_is_named(bootstrap: Any) -> None:
    with pytest.raises(TypeError, match="bootstrap must be a str"):
        parse_bootstrap(bootstrap)


def test_every_client_parses_bootstrap_at_construction() -> None:
    with pytest.raises(ValueError, match="'nohost'"):
        Producer("nohost")
    with pytest.raises(ValueError, match="'nohost'"):
        Consumer("ok:1,nohost")


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"request_timeout_ms": "30000"}, TypeError, "request_timeout_ms must be an int"),
        ({"max_block_ms": 0}, ValueError, "max_block_ms must be >= 1"),
        ({"batch_size": 1.5}, TypeError, "batch_size must be an int"),
        ({"linger_ms": "5"}, TypeError, "linger_ms must be a number"),
        ({"linger_ms": -1}, ValueError, "linger_ms must be >= 0"),
        ({"delivery_timeout_ms": True}, TypeError, "delivery_timeout_ms must be an int"),
        # Kafka's ProducerConfig: delivery.timeout.ms >= linger.ms + request.timeout.ms.
        (
            {"delivery_timeout_ms": 30_000},
            ValueError,
            r"delivery_timeout_ms \(30000\) must be at least linger_ms \+ request_timeout_ms "
            r"\(5 \+ 30000 = 30005\)",
        ),
    ],
)
def test_producer_arguments_are_checked_by_name(
    kwargs: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        Producer("h:1", **kwargs)


def test_the_default_delivery_timeout_grows_to_cover_one_attempt() -> None:
    with Producer("h:1", request_timeout_ms=200_000, linger_ms=10) as producer:
        assert producer._sender.settings.delivery_timeout_s == pytest.approx(200.01)
    with Producer("h:1") as producer:
        assert producer._sender.settings.delivery_timeout_s == 120


def test_transactional_arguments_are_checked_by_name() -> None:
    with pytest.raises(TypeError, match="transactional_id must be a str, not int"):
        TransactionalProducer("h:1", 123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="transaction_timeout_ms must be an int"):
        TransactionalProducer("h:1", "tx", transaction_timeout_ms="1000")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"transaction_timeout_ms \(60000\) must be longer than delivery_timeout_ms \(60000\)",
    ):
        TransactionalProducer(
            "h:1", "tx", transaction_timeout_ms=60_000, delivery_timeout_ms=60_000
        )


def test_the_default_transaction_timeout_outlasts_a_batch_delivery() -> None:
    """A batch that cannot be delivered expires (the transaction can be aborted
    and the producer goes on) before the coordinator times the transaction
    out (which fences the producer)."""
    with TransactionalProducer("h:1", "tx") as producer:
        assert producer.transaction_timeout_ms == 150_000  # 120 s delivery + 30 s request
    with TransactionalProducer(
        "h:1", "tx", delivery_timeout_ms=10_000, request_timeout_ms=5_000
    ) as producer:
        assert producer.transaction_timeout_ms == 60_000  # Kafka's default suffices
    with TransactionalProducer("h:1", "tx", transaction_timeout_ms=1_000) as producer:
        assert producer.transaction_timeout_ms == 1_000  # an explicit choice is kept


@pytest.mark.parametrize(
    ("call", "error", "named"),
    [
        (
            lambda p: p.send("t", b"v", partition="0"),
            TypeError,
            "partition must be an int, not str",
        ),
        (lambda p: p.send("t", b"v", partition=-1), ValueError, "partition must be >= 0"),
        (lambda p: p.send(b"t", b"v"), TypeError, "topic must be a str, not bytes"),
        (lambda p: p.send("", b"v"), ValueError, "topic must not be empty"),
        (lambda p: p.send("t", "text"), TypeError, "value must be bytes or None, not str"),
    ],
)
def test_send_arguments_are_checked_by_name_before_anything_else(
    call: Any, error: type[Exception], named: str
) -> None:
    with Producer("h:1", max_block_ms=1) as producer, pytest.raises(error, match=named):
        call(producer)
