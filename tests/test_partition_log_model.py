"""Property test: random interleavings of produce, markers, retries, restarts
and fetches on one real partition (segments on disk) against a small
reference model of what each isolation level may see."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from partition_log import codec
from partition_log.log import FsyncPolicy
from partition_log.partition import BatchSpec, Partition
from partition_log.producer_state import Verdict
from tests.reserved import reserved

TRANSACTIONAL = (1, 2)  # producer ids of transactional producers
IDEMPOTENT = 3


@dataclass
class ModelProducer:
    epoch: int = 0
    next_seq: int = 0
    open_first: int | None = None
    last_batch: tuple[int, int, int] | None = None  # (seq, count, base offset)


@dataclass
class Model:
    hw: int = 0
    #: offset -> (producer id, transaction key or None); control records are absent.
    data: dict[int, tuple[int, tuple[int, int] | None]] = field(default_factory=dict)
    outcome: dict[tuple[int, int], bool] = field(default_factory=dict)  # txn -> committed
    producers: dict[int, ModelProducer] = field(default_factory=dict)

    def lso(self) -> int:
        firsts = [p.open_first for p in self.producers.values() if p.open_first is not None]
        return min(firsts, default=self.hw)

    def visible(self, committed: bool) -> list[int]:
        upto = self.lso() if committed else self.hw
        return [
            o
            for o, (_, txn) in sorted(self.data.items())
            if o < upto and (not committed or txn is None or self.outcome.get(txn) is True)
        ]


def _records(n: int, tag: int) -> list[codec.RecordData]:
    return [
        codec.RecordData(key=b"k%d" % i, value=b"v%d-%d" % (tag, i), headers=(), timestamp_ms=i)
        for i in range(n)
    ]


class PartitionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="plog-model-"))
        self.partition = self._open()
        self.model = Model(producers={p: ModelProducer() for p in (*TRANSACTIONAL, IDEMPOTENT)})
        self.tag = 0

    def _open(self) -> Partition:
        return reserved(
            Partition(
                "t",
                0,
                self.dir / "t-0",
                segment_bytes=600,  # small: many segment rolls
                index_interval_bytes=128,
                fsync=FsyncPolicy.NEVER,
            )
        )

    def teardown(self) -> None:
        self.partition.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _append(self, pid: int, transactional: bool, n: int, seq: int, epoch: int) -> Verdict:
        self.tag += 1
        spec = BatchSpec(pid, epoch, seq, n, transactional)
        batch = codec.encode_batch(
            _records(n, self.tag),
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            transactional=transactional,
        )
        check = self.partition.append(spec, batch, verified=True)
        assert check.ok, check
        assert check.verdict is not None
        self._base = check.base_offset
        return check.verdict

    @rule(producer=st.sampled_from(TRANSACTIONAL), n=st.integers(1, 4))
    def transactional_send(self, producer: int, n: int) -> None:
        p = self.model.producers[producer]
        verdict = self._append(producer, True, n, p.next_seq, p.epoch)
        assert verdict is Verdict.APPEND
        assert self._base == self.model.hw
        if p.open_first is None:
            p.open_first = self._base
        for i in range(n):
            self.model.data[self._base + i] = (producer, (producer, p.epoch))
        p.last_batch = (p.next_seq, n, self._base)
        p.next_seq += n
        self.model.hw += n

    @rule(n=st.integers(1, 3))
    def idempotent_send(self, n: int) -> None:
        p = self.model.producers[IDEMPOTENT]
        assert self._append(IDEMPOTENT, False, n, p.next_seq, 0) is Verdict.APPEND
        for i in range(n):
            self.model.data[self._base + i] = (IDEMPOTENT, None)
        p.last_batch = (p.next_seq, n, self._base)
        p.next_seq += n
        self.model.hw += n

    @rule(n=st.integers(1, 3))
    def plain_send(self, n: int) -> None:
        assert self._append(-1, False, n, -1, -1) is Verdict.APPEND
        for i in range(n):
            self.model.data[self._base + i] = (-1, None)
        self.model.hw += n

    @rule(producer=st.sampled_from((*TRANSACTIONAL, IDEMPOTENT)))
    def retry_last_batch(self, producer: int) -> None:
        p = self.model.producers[producer]
        if p.last_batch is None:
            return
        seq, n, base = p.last_batch
        verdict = self._append(producer, producer != IDEMPOTENT, n, seq, p.epoch)
        assert verdict is Verdict.DUPLICATE
        assert self._base == base

    @rule(producer=st.sampled_from(TRANSACTIONAL), commit=st.booleans())
    def marker(self, producer: int, commit: bool) -> None:
        p = self.model.producers[producer]
        if p.open_first is None:
            return
        code, _ = self.partition.write_marker(producer, p.epoch + 1, 0, commit, 0)
        assert code == 0
        self.model.outcome[(producer, p.epoch)] = commit
        p.epoch += 1
        p.next_seq, p.open_first, p.last_batch = 0, None, None
        self.model.hw += 1  # the control record takes an offset

    @rule(producer=st.sampled_from(TRANSACTIONAL), commit=st.booleans())
    def retried_marker(self, producer: int, commit: bool) -> None:
        p = self.model.producers[producer]
        if p.open_first is not None or p.epoch == 0:
            return
        # The marker of the transaction that already closed, delivered again.
        code, _ = self.partition.write_marker(producer, p.epoch, 0, commit, 0)
        assert code == 0

    @precondition(lambda self: self.model.hw > 0)
    @rule()
    def restart(self) -> None:
        self.partition.close()
        self.partition = self._open()

    @rule(committed=st.booleans(), start=st.integers(0, 1000), max_bytes=st.integers(1, 400))
    def fetch(self, committed: bool, start: int, max_bytes: int) -> None:
        start = start % (self.model.hw + 1)
        upto = self.model.lso() if committed else self.model.hw
        seen: list[int] = []
        position = start
        for _ in range(self.model.hw + 2):
            result = self.partition.fetch(position, max_bytes, committed)
            assert result.error == 0
            assert result.high_watermark == self.model.hw
            assert result.last_stable_offset == self.model.lso()
            for batch in result.batches:
                seen.extend(r.offset for r in batch.records)
            if result.next_fetch_offset == position:
                break
            assert result.next_fetch_offset > position
            position = result.next_fetch_offset
        assert position >= min(upto, start) if start <= upto else True
        expected = [o for o in self.model.visible(committed) if o >= start]
        assert seen == expected

    @invariant()
    def offsets_agree(self) -> None:
        start, lso, end = self.partition.offsets()
        assert (start, lso, end) == (0, self.model.lso(), self.model.hw)


PartitionMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_partition_against_model = PartitionMachine.TestCase
