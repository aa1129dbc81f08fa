"""The audit's sources hand Spark Arrow record batches: what Spark reads
through them is exactly the rows the readers make (compared on a synthetic
run with every source's kinds of rows, the unreadable ones included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark import sources, synthetic
from spark.sources import (
    HISTORY,
    SEGMENTS,
    TRANSITIONS,
    HistoryReader,
    SegmentsReader,
    TransitionsReader,
)

pytestmark = pytest.mark.slow


def _rows(reader: Any) -> list[tuple[Any, ...]]:
    return [row for p in reader.partitions() for row in reader.rows(p)]


def _canonical(value: Any) -> Any:
    """A value as both paths give it, for comparison (Spark's Rows are tuples,
    its maps dicts)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_canonical(v) for v in value)
    return value


def test_spark_reads_through_arrow_exactly_the_rows_the_readers_make(
    spark: Any, tmp_path: Path
) -> None:
    run = synthetic.generate(2_000, partitions=4, seed=5)
    cluster, history = run.write(tmp_path)
    # Rows a source reports as unreadable, too: a damaged history line, a torn
    # transitions line.
    with history.open("a") as f:
        f.write("[1, 2]\n")
    transitions = next(cluster.glob("node-*/shard-*/transitions.jsonl"))
    with transitions.open("a") as f:
        f.write('{"index": 99999, "te')
    sources.register(spark)
    cases = [
        (SEGMENTS, str(cluster), SegmentsReader(str(cluster))),
        (TRANSITIONS, str(cluster), TransitionsReader(str(cluster))),
        (HISTORY, str(history), HistoryReader(str(history), sources._HISTORY_SPLIT_BYTES)),
    ]
    for name, path, reader in cases:
        expected = _rows(reader)
        assert any(row[-1] is not None or row[-2] is not None for row in expected), name
        read = spark.read.format(name).load(path).collect()
        assert sorted(map(_canonical, read), key=repr) == sorted(
            map(_canonical, expected), key=repr
        ), name


def test_a_reader_cuts_its_rows_into_batches_of_the_set_size(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, _history = synthetic.generate(300, partitions=1, seed=5).write(tmp_path)
    sources.register(spark)
    schema = spark.read.format(SEGMENTS).load(str(cluster)).schema
    monkeypatch.setattr(sources, "ARROW_BATCH_ROWS", 50)
    reader = SegmentsReader(str(cluster), schema)
    partition = max(reader.partitions(), key=lambda p: len(list(reader.rows(p))))
    rows = list(reader.rows(partition))
    batches = list(reader.read(partition))
    assert len(rows) > 100
    assert [b.num_rows for b in batches] == [50] * (len(rows) // 50) + (
        [len(rows) % 50] if len(rows) % 50 else []
    )
    assert [tuple(r.values()) for b in batches for r in b.to_pylist()] == rows
