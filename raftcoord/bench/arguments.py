"""The command-line arguments of each benchmark (``raftcoord bench`` and its
suites), by the module under :mod:`raftcoord.bench` that runs it. Light: it
imports nothing but the standard library, so that ``raftcoord bench
[SUITE] --help`` loads none of what the benchmarks run (gRPC, cryptography,
Spark)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["ADD_ARGUMENTS", "parse_size"]

#: Client thread counts of the coordinator benchmark's transactions.
COORDINATOR_THREADS = (1, 8, 32)
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """A size such as 10M, 1G or 4096 in bytes."""
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _targets(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every phase small (about 50 s on 2 cores, load average 7-16)",
    )
    parser.add_argument("--json", dest="json_path", help="also write the results here as JSON")
    parser.add_argument("--dir", help="parent of the cluster directories (default: system tmp)")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=4,
        help="client processes the producers are spread over (default: %(default)s)",
    )
    parser.add_argument("--seconds", type=float, help="per load step (default 6; --quick 1.5)")
    parser.add_argument(
        "--producers", type=_ints, help="producer counts end to end (default 1,8,32,128)"
    )
    parser.add_argument(
        "--one-process",
        type=_ints,
        help="producer threads of the one-process phase (default 1,8,32; --quick 1,32)",
    )
    parser.add_argument(
        "--raft-n", type=int, help="sequential Raft commits measured (default 300; --quick 50)"
    )
    parser.add_argument(
        "--open",
        type=_ints,
        help="open-transaction levels beyond 100 (default 10000,100000; --quick 1000)",
    )
    parser.add_argument(
        "--open-budget-s",
        type=float,
        help="most seconds spent opening transactions; a level not reached in it is "
        "reported with the count and rate reached (default 240; --quick 20)",
    )
    parser.add_argument(
        "--failovers", type=int, help="leader kills, the median is reported (default 5; --quick 1)"
    )
    parser.add_argument(
        "--scale-shards", type=_ints, help="shard counts of the scaling phase (default 1..6)"
    )
    parser.add_argument(
        "--skip",
        type=lambda s: set(s.split(",")),
        default=set(),
        help="phases to leave out: "
        "ceilings,e2e,offered,one-process,interval,failover,kafka,open,scaling",
    )
    parser.add_argument(
        "--offered",
        type=_ints,
        help="offered loads of the open-loop phase, txn/s over 32 producers (default 150,600)",
    )
    parser.add_argument(
        "--kafka",
        type=_ints,
        help="confluent-kafka producers through a Kafka gateway (default 1,8,32; --quick 1,32)",
    )


def _audit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--shuffle-partitions", type=int, help="spark.sql.shuffle.partitions (default: cores)"
    )


def _coordinator(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smaller counts, one fsync policy")
    parser.add_argument(
        "--fsync",
        "--fsync-policies",
        dest="fsync",
        default=None,
        help="comma-separated fsync policies (default: always,never; --quick: always)",
    )
    parser.add_argument("--find-n", type=int, default=None, help="FindCoordinator calls")
    parser.add_argument("--sync-n", type=int, default=None, help="sync requests per kind")
    parser.add_argument("--seconds", type=float, default=None, help="per transaction run")
    parser.add_argument(
        "--threads",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(COORDINATOR_THREADS),
        help="client thread counts for transactions (default 1,8,32)",
    )
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--dir", default=None, help="parent of the cluster dir (default: tmp)")


def _grpc_style(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="1 s per step instead of 4")
    parser.add_argument("--seconds", type=float, help="per step (default 4; --quick 1)")
    parser.add_argument(
        "--callers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 8, 32, 128],
        help="concurrent caller counts (default 1,8,32,128)",
    )
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--json", dest="json_path", help="also write the results here as JSON")


def _kafka_codec(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=10)


def _kafka_gateway(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transactions", type=int, default=40)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=100)


def _plog_startup(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="10M,100M", help="log sizes, e.g. 10M,100M,1G")
    parser.add_argument("--segment-bytes", type=parse_size, default=64 << 20)
    parser.add_argument("--records", type=int, default=10, help="records per batch")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--txn-batches", type=int, default=20, help="batches per transaction")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the temporary logs go")


def _raft_commit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=200, help="sync commits (aggressive tick)")
    parser.add_argument(
        "--n-default-tick", type=int, default=50, help="sync commits (default tick)"
    )
    parser.add_argument("--full", action="store_true", help="use --n for both tick settings")
    parser.add_argument("--tput-s", type=float, default=2.0)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--dir", default=None, help="directory for journals (default: system tmp)")


def _snapshot(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        default="10000,50000,100000",
        help="open transactions in the shard, comma separated (default 10000,50000,100000)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per size (default 3)")
    parser.add_argument("--dir", default=None, help="parent of the temporary directories")


def _variants(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=10.0, help="per step (10)")
    parser.add_argument(
        "--producers", default="1,8", help="producer threads of each step, comma-separated (1,8)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="times the two clusters take turns (1)"
    )
    parser.add_argument("--dir", help="where the clusters' temporary directories go")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")


#: Module under raftcoord.bench -> the function that adds its arguments.
ADD_ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "targets": _targets,
    "audit": _audit,
    "coordinator": _coordinator,
    "grpc_style": _grpc_style,
    "kafka_codec": _kafka_codec,
    "kafka_gateway": _kafka_gateway,
    "plog_startup": _plog_startup,
    "raft_commit": _raft_commit,
    "snapshot": _snapshot,
    "variants": _variants,
}
