"""The audit's checks, as Spark DataFrame jobs over the three sources.

The truth is re-derived from the data, the way Kafka defines it:

* In a partition log, a transactional data batch of producer id P belongs to
  P's transaction that the next control batch of P in that log closes. A
  COMMIT marker (of an epoch at least the data's) makes the batch visible to
  read_committed consumers, an ABORT hides it, and a batch with no such
  marker after it is still open. Non-transactional batches are visible at
  once. The last stable offset is the first offset of the earliest open
  transaction; nothing from it on is visible.
* The coordinator's decision for a transaction is the Prepare* transition of
  its applied-transitions logs; its epoch is the markers' epoch, and the
  transaction's own epoch (its records') is the one of the ONGOING state
  that began it (a transaction kept for a two-phase commit moves to ONGOING
  again at a bumped epoch, its records keeping the first).
* A history transaction committed when its ``commit`` is ``ok``, aborted
  after an ``abort`` or a failed ``commit``, unknown after a ``commit``
  ``info``, and is still open without any of these.

Each check is a DataFrame of violations; the driver collects only its count
and a few examples.

One file on purpose (about 1,000 lines): every check reads the same derived
tables (decisions, visible records, polls), built once by :class:`Audit`;
splitting the checks would split what they share.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

#: examples kept per check, and per kind of violation for the checks of :data:`KINDS`
EXAMPLES = 5
#: the fault kinds whose end restarts a partition-log node (docs/history.md)
_PLOG_RESTARTS = ("plog-restart", "plog-leader-kill", "plog-wipe", "disk", "heal-restart")
#: producer sequences wrap from here to 0
_SEQUENCE_MAX = 2**31 - 1
PREPARE = {"PREPARE_COMMIT": "COMMIT", "PREPARE_ABORT": "ABORT"}
#: (name, what a violation is), in the order the report lists them
CHECKS: list[tuple[str, str]] = [
    ("lost-write", "a write of an acknowledged commit is missing from the logs or the final read"),
    ("duplicate", "a value at more than one offset, or an input transformed more than once"),
    ("aborted-read", "data of an aborted transaction is visible or read with read_committed"),
    ("torn-transaction", "a transaction visible in some partitions and not in others"),
    ("uncommitted-read", "a read_committed poll returned data before its transaction was stable"),
    (
        "one-decision",
        "COMMIT and ABORT for one transaction, or markers disagree with the coordinator",
    ),
    ("zombie-write", "committed data written at an epoch other than its transaction's"),
    ("epoch-order", "a producer id's epochs go backwards in a partition log"),
    ("leader-epoch-order", "the leader epochs of a partition log's batches go backwards"),
    ("inconsistent-offsets", "one offset of a partition holds two values across reads and the log"),
    ("nonmonotonic-poll", "a poller read a partition's offsets out of order or twice"),
    ("skipped-poll", "a poller jumped over a record visible to read_committed"),
    (
        "replica-divergence",
        "coordinator replicas applied different transitions at one Raft entry, or partition "
        "replicas hold different records at one offset and leader epoch",
    ),
    ("exactly-once-pipeline", "outputs are not one per consumed input, or offsets not at the end"),
    ("order", "a producer's records in a partition out of the order it sent them"),
    ("unseen", "a committed write that no poller read by the end"),
    ("liveness", "a transaction still open at the end of the run"),
    ("unreadable-data", "a batch, transition or history event that cannot be decoded"),
]
DESCRIPTIONS = dict(CHECKS)
#: The checks whose violations come in kinds, and the column naming the kind:
#: each kind keeps :data:`EXAMPLES` examples of its own, so that one kind's
#: many violations do not hide another's few.
KINDS = {
    "duplicate": "kind",
    "torn-transaction": "where",
    "one-decision": "problem",
    "replica-divergence": "problem",
    "exactly-once-pipeline": "problem",
    "order": "kind",
    "liveness": "where",
}


@dataclass
class CheckResult:
    name: str
    count: int
    examples: list[dict[str, Any]] = field(default_factory=list)
    #: why the check could not run (then ``count`` is 0)
    skipped: str | None = None
    #: what the check ran on too little to judge: the inputs of :meth:`Audit.needs`
    #: it saw none of (a check that found nothing in nothing proves nothing)
    lacked: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.skipped:
            return "SKIP"
        if self.count:
            return "FAIL"
        return "INCOMPLETE" if self.lacked else "PASS"

    @property
    def incomplete(self) -> str | None:
        """Why the check does not count as passed, when it found nothing."""
        if self.skipped:
            return self.skipped
        if self.lacked and not self.count:
            return "nothing to judge: saw no " + ", and no ".join(self.lacked)
        return None

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.name]


def _tp(prefix: str = "") -> list[str]:
    return [f"{prefix}topic", f"{prefix}partition"]


class Audit:
    """Derived data sets (cached) and the checks over them.

    ``segments`` and ``transitions`` are the sources of :mod:`spark.sources`;
    ``history`` may be None, and then the checks that need it are skipped.
    A partition with replicas is read on every node holding one: the checks
    of the log read one replica per partition, the newest leader's
    (:func:`_newest_replica`), and ``replica-divergence`` compares the others
    with it.
    """

    def __init__(
        self, segments: DataFrame, transitions: DataFrame, history: DataFrame | None
    ) -> None:
        self.replica_segments = segments.cache()
        self.replica_batches = self.replica_segments.where(
            (F.col("record_index") == 0) & F.col("magic").isNotNull()
        )
        self.segments = _newest_replica(self.replica_segments, self.replica_batches).cache()
        self.transitions = transitions.cache()
        self.history = None if history is None else history.cache()
        # Read every input once, up front: the planner then knows their sizes and joins
        # small tables by broadcasting them instead of shuffling both sides.
        self.rows = {
            "segment rows": self.replica_segments.count(),
            "transitions (all replicas)": self.transitions.count(),
        }
        if self.history is not None:
            self.rows["history events"] = self.history.count()
        self._derive_logs()
        self._derive_coordinator()
        if self.history is not None:
            self._derive_history(self.history)

    # --- the logs ----------------------------------------------------------------------------

    def _derive_logs(self) -> None:
        recs = self.segments.where(F.col("record_index").isNotNull() & F.col("magic").isNotNull())
        batches = recs.where(F.col("record_index") == 0)
        self.batches = batches
        with_pid = batches.where((F.col("producer_id") >= 0) & F.col("transactional"))
        closing = Window.partitionBy("topic", "partition", "producer_id").orderBy(
            F.col("base_offset").desc()
        )
        with_pid = with_pid.withColumn(
            "closing_offset",
            F.min(F.when(F.col("control"), F.col("base_offset"))).over(
                closing.rowsBetween(Window.unboundedPreceding, Window.currentRow)
            ),
        )
        markers = with_pid.where(F.col("control")).select(
            *_tp(),
            "producer_id",
            F.col("base_offset").alias("closing_offset"),
            F.col("producer_epoch").alias("marker_epoch"),
            F.coalesce("txn_number", F.lit(-1)).alias("marker_txn"),
            F.col("control_type").alias("marker_type"),
            "coordinator_epoch",
            F.col("max_timestamp").alias("marker_ts"),
        )
        self.markers = markers.withColumnRenamed("closing_offset", "offset").cache()
        data = with_pid.where(~F.col("control")).join(
            markers, [*_tp(), "producer_id", "closing_offset"], "left"
        )
        status = (
            F.when(F.col("marker_type").isNull(), "OPEN")
            .when(F.col("marker_epoch") < F.col("producer_epoch"), "OPEN")
            .when(F.col("marker_type") == "COMMIT", "COMMITTED")
            .otherwise("ABORTED")
        )
        txn_data = data.withColumn("status", status)
        plain = (
            batches.where(
                ~F.col("control") & ~(F.col("transactional") & (F.col("producer_id") >= 0))
            )
            .withColumn("status", F.lit("PLAIN"))
            .withColumn("marker_epoch", F.lit(None).cast("int"))
            .withColumn("marker_txn", F.lit(None).cast("long"))
            .withColumn("marker_ts", F.lit(None).cast("long"))
        )
        cols = [
            *_tp(),
            "base_offset",
            "last_offset",
            "producer_id",
            "producer_epoch",
            "status",
            "marker_epoch",
            "marker_txn",
            "marker_ts",
        ]
        data_batches = txn_data.select(*cols).unionByName(plain.select(*cols))
        # Which transaction of its producer id and epoch a batch is part of:
        # under transactions v2 the epoch names one (-1 here); under v1 (a
        # marker of the data's own epoch) the marker's transaction number.
        data_batches = data_batches.withColumn(
            "txn_key",
            F.when(F.col("marker_epoch") == F.col("producer_epoch"), F.col("marker_txn")).otherwise(
                F.lit(-1).cast("long")
            ),
        )
        lso = (
            data_batches.where(F.col("status") == "OPEN")
            .groupBy(*_tp())
            .agg(F.min("base_offset").alias("lso"))
        )
        data_batches = data_batches.join(lso, _tp(), "left").withColumn(
            "visible",
            F.col("status").isin("COMMITTED", "PLAIN")
            & (F.col("lso").isNull() | (F.col("base_offset") < F.col("lso"))),
        )
        self.data_batches = data_batches.cache()
        self.records = (
            recs.where(~F.col("control"))
            .select(*_tp(), "base_offset", "offset", "value")
            .join(self.data_batches.drop("last_offset"), [*_tp(), "base_offset"])
            .cache()
        )
        self.visible = self.records.where("visible").select(*_tp(), "offset", "value").cache()
        self.ends = batches.groupBy(*_tp()).agg((F.max("last_offset") + 1).alias("end"))

    # --- the coordinator ---------------------------------------------------------------------

    def _derive_coordinator(self) -> None:
        lines = self.transitions.where(F.col("index").isNotNull()).withColumn(
            "shard", F.coalesce("file_shard", "shard")
        )
        # A replica whose state a snapshot replaced (a follower too far behind) applied
        # the entries it covers without logging them, and says so in one marker line.
        self.snapshot_markers = lines.where(F.col("snapshot")).select(
            "node", "shard", "line", "index"
        )
        tr = lines.where(~F.col("snapshot"))
        tr = tr.withColumn(
            "pos",
            F.row_number().over(Window.partitionBy("node", "shard", "index").orderBy("line")),
        )
        self.replica_transitions = tr.cache()
        unique = tr.dropDuplicates(["shard", "index", "pos", "text"])
        before = (
            Window.partitionBy("transactional_id")
            .orderBy("index", "pos")
            .rowsBetween(Window.unboundedPreceding, -1)
        )
        unique = unique.withColumn(
            "txn_number",
            F.coalesce(F.get_json_object("text", "$.txn_number").cast("long"), F.lit(-1)),
        ).withColumn(
            "txn_epoch",
            F.last(
                F.when(
                    (F.col("to_state") == "ONGOING")
                    & ~F.coalesce(F.col("from_state") == "ONGOING", F.lit(False)),
                    F.col("producer_epoch"),
                ),
                True,
            ).over(before),
        )
        self.unique_transitions = unique.cache()
        decision = F.create_map(*[F.lit(x) for kv in PREPARE.items() for x in kv])[
            F.col("to_state")
        ]
        self.decisions = (
            unique.where(F.col("to_state").isin(*PREPARE))
            .groupBy(
                "producer_id",
                F.col("producer_epoch").alias("marker_epoch"),
                F.col("txn_number").alias("marker_txn"),
            )
            .agg(
                F.array_sort(F.collect_set(decision)).alias("decisions"),
                F.max("txn_epoch").alias("txn_epoch"),
                F.first("transactional_id").alias("transactional_id"),
            )
            .cache()
        )

    # --- the history -------------------------------------------------------------------------

    def _derive_history(self, hist: DataFrame) -> None:
        ok = hist.where(F.col("problem").isNull())
        by_process = Window.partitionBy("process").orderBy("index")
        # One operation outstanding per process: a completion's invoke is the event before.
        paired = ok.select(
            "*",
            F.lag("type").over(by_process).alias("inv_type"),
            F.lag("time_ms").over(by_process).alias("inv_time"),
            F.lag("topic").over(by_process).alias("inv_topic"),
            F.lag("partition").over(by_process).alias("inv_partition"),
            F.lag("value").over(by_process).alias("inv_value"),
            F.lag("isolation").over(by_process).alias("inv_isolation"),
        )
        self.completions = paired.where(F.col("type") != "invoke").cache()
        ends = self.completions.where(
            F.col("op").isin("commit", "abort") & F.col("txn").isNotNull()
        )
        outcome = ends.groupBy("txn").agg(
            F.max((F.col("op") == "commit") & (F.col("type") == "ok")).alias("c_ok"),
            F.max(
                (F.col("op") == "abort") | ((F.col("op") == "commit") & (F.col("type") == "fail"))
            ).alias("a"),
        )
        self.outcomes = outcome.select(
            "txn",
            F.when(F.col("c_ok"), "committed")
            .when(F.col("a"), "aborted")
            .otherwise("unknown")
            .alias("outcome"),
        )
        self.faults = ok.where(F.col("op") == "fault").cache()
        sends = ok.where((F.col("op") == "send") & (F.col("type") == "invoke")).select(
            "txn", "process", "index", *_tp(), "value", "source"
        )
        self.sends = sends
        sends = sends.drop("index")
        listed = (
            ok.where(F.col("op").isin("commit", "abort") & (F.col("type") == "invoke"))
            .select("txn", "process", F.explode("writes").alias("w"))
            .select("txn", "process", "w.topic", "w.partition", "w.value")
            .withColumn("source", F.lit(None).cast(sends.schema["source"].dataType))
        )
        writes = (
            sends.unionByName(listed)
            .groupBy("txn", "process", *_tp(), "value")
            .agg(F.first("source", True).alias("source"))
        )
        self.writes = (
            writes.join(self.outcomes, "txn", "left")
            .withColumn("outcome", F.coalesce("outcome", F.lit("open")))
            .cache()
        )
        poll_ok = self.completions.where((F.col("op") == "poll") & (F.col("type") == "ok"))
        self.poll_reads = (
            poll_ok.select(
                "process",
                "index",
                "time_ms",
                F.col("inv_isolation").alias("isolation"),
                F.posexplode("reads").alias("pos", "r"),
            )
            .select("process", "index", "time_ms", "isolation", "pos", "r.*")
            .cache()
        )
        self.final = ok.where(F.col("op") == "final").cache()
        self.final_reads = self.final.select(F.explode("reads").alias("r")).select("r.*").cache()
        facts = ok.agg(
            F.max(F.col("op") == "final").alias("final"),
            F.max((F.col("op") == "poll") & F.col("process").startswith("poller-")).alias("polls"),
            F.first("input_topic", True).alias("input_topic"),
            F.first("output_topic", True).alias("output_topic"),
        ).first()
        assert facts is not None
        self.has_final = bool(facts["final"])
        self.has_pollers = bool(facts["polls"])
        self.input_topic: str | None = facts["input_topic"]
        self.output_topic: str | None = facts["output_topic"]

    # --- the checks --------------------------------------------------------------------------

    def run(self) -> list[CheckResult]:
        checks: dict[str, Callable[[], DataFrame | str]] = {
            "lost-write": self.lost_write,
            "duplicate": self.duplicate,
            "aborted-read": self.aborted_read,
            "torn-transaction": self.torn_transaction,
            "uncommitted-read": self.uncommitted_read,
            "one-decision": self.one_decision,
            "zombie-write": self.zombie_write,
            "epoch-order": self.epoch_order,
            "leader-epoch-order": self.leader_epoch_order,
            "inconsistent-offsets": self.inconsistent_offsets,
            "nonmonotonic-poll": self.nonmonotonic_poll,
            "skipped-poll": self.skipped_poll,
            "replica-divergence": self.replica_divergence,
            "exactly-once-pipeline": self.exactly_once_pipeline,
            "order": self.order,
            "unseen": self.unseen,
            "liveness": self.liveness,
            "unreadable-data": self.unreadable_data,
        }
        found: list[DataFrame] = []
        skipped: dict[str, str] = {}
        needs: dict[str, list[str]] = {}
        for name, _ in CHECKS:
            check = checks[name]()
            if isinstance(check, str):
                skipped[name] = check
                continue
            row = F.to_json(F.struct(*check.columns)).alias("row")
            kind = F.col(KINDS[name]) if name in KINDS else F.lit(None)
            found.append(
                check.select(
                    F.lit(name).alias("check"),
                    row,
                    kind.cast("string").alias("kind"),
                    F.lit(None).cast("int").alias("need"),
                )
            )
            needs[name] = []
            for i, (what, seen) in enumerate(self.needs(name)):
                needs[name].append(what)
                found.append(
                    seen.limit(1).select(
                        F.lit(name).alias("check"),
                        F.lit(None).cast("string").alias("row"),
                        F.lit(None).cast("string").alias("kind"),
                        F.lit(i).alias("need"),
                    )
                )
        # One job for every check: each violation becomes (check, row as JSON, its kind),
        # each input a check needs one row (check, need); the driver gets the count, the
        # first few rows of each check (and kind), and which needs were met.
        everything = functools.reduce(DataFrame.unionByName, found)
        per_check = Window.partitionBy("check")
        per_kind = Window.partitionBy("check", "kind").orderBy(F.col("row").asc_nulls_last())
        firsts = (
            everything.withColumn("n", F.count("row").over(per_check))
            .withColumn("rank", F.row_number().over(per_kind))
            .where(F.col("need").isNotNull() | (F.col("rank") <= EXAMPLES))
            .collect()
        )
        counts = {r["check"]: r["n"] for r in firsts}
        met = {(r["check"], r["need"]) for r in firsts if r["need"] is not None}
        examples: dict[str, list[dict[str, Any]]] = {}
        for r in sorted(firsts, key=lambda r: (r["rank"], r["kind"] or "")):
            if r["need"] is None:
                examples.setdefault(r["check"], []).append(json.loads(r["row"]))
        return [
            CheckResult(
                name,
                counts.get(name, 0),
                examples.get(name, []),
                skipped.get(name),
                [what for i, what in enumerate(needs.get(name, [])) if (name, i) not in met],
            )
            for name, _ in CHECKS
        ]

    def needs(self, name: str) -> list[tuple[str, DataFrame]]:
        """What check ``name`` must have seen to mean something: (what, its rows), each
        of which must hold a row, or the check is INCOMPLETE. Called for a check that
        runs (its inputs are there)."""
        if name in ("lost-write", "unseen"):
            return [
                (
                    "write of a committed transaction (commit ok) in the history",
                    self.writes.where(F.col("outcome") == "committed"),
                )
            ]
        if name == "duplicate":
            return [("record visible to read_committed in the logs", self.visible)]
        if name == "aborted-read":
            return [
                (
                    "write of an aborted transaction in the history",
                    self.writes.where(F.col("outcome") == "aborted"),
                ),
                (
                    "record read with read_committed (a poll or the final read)",
                    self._committed_reads(),
                ),
            ]
        if name == "torn-transaction":
            return [
                (
                    "transactional data batch in the logs",
                    self.data_batches.where(F.col("status") != "PLAIN"),
                )
            ]
        if name == "uncommitted-read":
            return [
                (
                    "record returned by a read_committed poll",
                    self.poll_reads.where(F.col("isolation") == "read_committed"),
                )
            ]
        if name == "one-decision":
            return [("COMMIT or ABORT marker in the logs", self.markers)]
        if name == "zombie-write":
            return [
                (
                    "committed transactional data in the logs",
                    self.data_batches.where(F.col("status") == "COMMITTED"),
                )
            ]
        if name == "epoch-order":
            return [
                ("batch with a producer id in the logs", self.batches.where("producer_id >= 0"))
            ]
        if name == "leader-epoch-order":
            return [("batch in the logs", self.batches)]
        if name == "inconsistent-offsets":
            return [("record in the logs", self.records)]
        if name == "nonmonotonic-poll":
            return [("two reads of one partition by one poller", self._poller_pairs())]
        if name == "skipped-poll":
            return [
                (
                    "two read_committed reads of one partition by one poller",
                    self._poller_pairs().where(F.col("isolation") == "read_committed"),
                ),
                ("record visible to read_committed in the logs", self.visible),
            ]
        if name == "replica-divergence":
            return [("two replicas of a shard or of a partition", self._replicated())]
        if name == "exactly-once-pipeline":
            return [
                (
                    "input record below the workers' committed offsets",
                    self._consumed_inputs(self._committed_offsets()),
                ),
                ("visible output of the workers", self._visible_outputs()),
            ]
        if name == "order":
            return [("two records of one producer in one partition", self._ordered_pairs())]
        if name == "liveness":
            return [
                (
                    "transaction in the coordinators' transitions or the logs",
                    self.unique_transitions.select(F.lit(1).alias("seen")).unionByName(
                        self.data_batches.where(F.col("status") != "PLAIN").select(
                            F.lit(1).alias("seen")
                        )
                    ),
                )
            ]
        if name == "unreadable-data":
            return [
                (
                    "row of the partition logs or the transitions",
                    self.replica_segments.select(F.lit(1).alias("seen")).unionByName(
                        self.transitions.select(F.lit(1).alias("seen"))
                    ),
                )
            ]
        raise KeyError(name)

    def _replicated(self) -> DataFrame:
        """One row per shard and per partition held by two replicas or more."""
        shards = (
            self.replica_transitions.groupBy("shard")
            .agg(F.countDistinct("node").alias("replicas"))
            .select("replicas")
        )
        partitions = (
            self.replica_batches.groupBy(*_tp())
            .agg(F.countDistinct("node").alias("replicas"))
            .select("replicas")
        )
        return shards.unionByName(partitions).where(F.col("replicas") >= 2)

    def _ordered_pairs(self) -> DataFrame:
        """One row per producer with two data batches (its id and epoch, in the logs)
        or two visible writes (its process, in the history) in one partition: what
        ``order`` compares."""
        in_logs = (
            self.batches.where(~F.col("control") & (F.col("producer_id") >= 0))
            .groupBy(*_tp(), "producer_id", "producer_epoch")
            .agg(F.count("*").alias("n"))
            .select("n")
        )
        if self.history is None:
            return in_logs.where(F.col("n") >= 2)
        sent = (
            self.sends.join(self.visible.select(*_tp(), "value"), [*_tp(), "value"], "left_semi")
            .groupBy("process", *_tp())
            .agg(F.count("*").alias("n"))
            .select("n")
        )
        return in_logs.unionByName(sent).where(F.col("n") >= 2)

    def _needs_history(self) -> str | None:
        return "no history given" if self.history is None else None

    def lost_write(self) -> DataFrame | str:
        if (why := self._needs_history()) is not None:
            return why
        committed = self.writes.where(F.col("outcome") == "committed").select(
            "txn", *_tp(), "value"
        )
        found = committed.join(self.visible, [*_tp(), "value"], "left_anti").withColumn(
            "missing_from", F.lit("logs")
        )
        if self.has_final:
            in_final = committed.join(
                self.final_reads.select(*_tp(), "value"), [*_tp(), "value"], "left_anti"
            ).withColumn("missing_from", F.lit("final read"))
            found = found.unionByName(in_final)
        return found.groupBy("txn", *_tp(), "value").agg(
            F.array_sort(F.collect_set("missing_from")).alias("missing_from")
        )

    def duplicate(self) -> DataFrame:
        in_logs = (
            self.visible.groupBy("value")
            .agg(F.count("*").alias("n"), F.collect_list(F.struct(*_tp(), "offset")).alias("at"))
            .where("n > 1")
            .select(F.lit("value at two offsets in the logs").alias("kind"), "value", "at")
        )
        if self.history is None:
            return in_logs
        reads = self._all_reads().select(*_tp(), "offset", "value").distinct()
        in_reads = (
            reads.groupBy("value")
            .agg(F.count("*").alias("n"), F.collect_list(F.struct(*_tp(), "offset")).alias("at"))
            .where("n > 1")
            .select(F.lit("value read at two offsets").alias("kind"), "value", "at")
        )
        outputs = self._visible_outputs()
        transformed = (
            outputs.groupBy("source")
            .agg(
                F.count("*").alias("n"),
                F.collect_list(F.struct(*_tp(), "offset")).alias("at"),
            )
            .where("n > 1")
            .select(
                F.lit("input transformed more than once").alias("kind"),
                F.col("source.value").alias("value"),
                "at",
            )
        )
        return in_logs.unionByName(in_reads).unionByName(transformed)

    def aborted_read(self) -> DataFrame | str:
        if (why := self._needs_history()) is not None:
            return why
        aborted = self.writes.where(F.col("outcome") == "aborted").select("txn", *_tp(), "value")
        committed_reads = self._committed_reads()
        in_logs = aborted.join(self.visible, [*_tp(), "value"], "left_semi").withColumn(
            "seen_in", F.lit("logs")
        )
        in_reads = aborted.join(
            committed_reads.select(*_tp(), "value", "seen_in"), [*_tp(), "value"], "left_semi"
        ).withColumn("seen_in", F.lit("read_committed read"))
        aborted_log = self.records.where(F.col("status") == "ABORTED").select(
            *_tp(), "offset", F.col("value").alias("log_value")
        )
        read_aborted = (
            committed_reads.join(aborted_log, [*_tp(), "offset"])
            .select(F.lit(None).cast("string").alias("txn"), *_tp(), "value")
            .withColumn("seen_in", F.lit("read of aborted log data"))
        )
        return in_logs.unionByName(in_reads).unionByName(read_aborted).distinct()

    def torn_transaction(self) -> DataFrame:
        in_logs = (
            self.data_batches.where(F.col("producer_id") >= 0)
            .where(F.col("status") != "PLAIN")
            .groupBy("producer_id", "producer_epoch", "txn_key")
            .agg(
                F.collect_set("status").alias("statuses"),
                F.collect_list(F.struct(*_tp(), "base_offset", "status")).alias("batches"),
            )
            .where(F.array_contains("statuses", "COMMITTED") & (F.size("statuses") > 1))
            .select(
                F.lit("logs").alias("where"),
                _transaction_name().alias("transaction"),
                F.col("batches").cast("string").alias("detail"),
            )
        )
        if self.history is None:
            return in_logs
        unknown = self.writes.where(F.col("outcome").isin("unknown", "open"))
        seen = self.visible.select(*_tp(), "value", F.lit(1).alias("seen"))
        torn = (
            unknown.join(seen, [*_tp(), "value"], "left")
            .groupBy("txn")
            .agg(F.count("*").alias("writes"), F.count("seen").alias("visible"))
            .where((F.col("visible") > 0) & (F.col("visible") < F.col("writes")))
            .select(
                F.lit("history").alias("where"),
                F.col("txn").alias("transaction"),
                F.format_string("%d of %d writes visible", "visible", "writes").alias("detail"),
            )
        )
        return in_logs.unionByName(torn)

    def uncommitted_read(self) -> DataFrame | str:
        if (why := self._needs_history()) is not None:
            return why
        reads = self.poll_reads.where(F.col("isolation") == "read_committed")
        return (
            reads.join(
                self.records.select(*_tp(), "offset", "status", "marker_ts"), [*_tp(), "offset"]
            )
            .where(
                (F.col("status") == "OPEN")
                | ((F.col("status") == "COMMITTED") & (F.col("marker_ts") > F.col("time_ms")))
            )
            .select("process", "index", *_tp(), "offset", "value", "status", "marker_ts", "time_ms")
        )

    def one_decision(self) -> DataFrame:
        by_txn = (
            self.markers.groupBy("producer_id", "marker_epoch", "marker_txn")
            .agg(
                F.array_sort(F.collect_set("marker_type")).alias("types"),
                F.collect_list(F.struct(*_tp(), "offset", "marker_type")).alias("markers"),
            )
            .join(self.decisions, ["producer_id", "marker_epoch", "marker_txn"], "left")
        )
        problem = (
            F.when(F.size("types") > 1, "COMMIT and ABORT markers")
            .when(F.size("decisions") > 1, "the coordinator decided both")
            .when(F.col("decisions").isNull(), "no coordinator decision for the markers")
            .when(F.col("types") != F.col("decisions"), "markers disagree with the coordinator")
        )
        return (
            by_txn.withColumn("problem", problem)
            .where(F.col("problem").isNotNull())
            .select(
                "problem",
                "producer_id",
                "marker_epoch",
                "marker_txn",
                "types",
                "decisions",
                "markers",
            )
        )

    def zombie_write(self) -> DataFrame:
        return (
            self.data_batches.where(F.col("status") == "COMMITTED")
            .join(self.decisions, ["producer_id", "marker_epoch", "marker_txn"])
            .where(F.col("txn_epoch").isNotNull() & (F.col("producer_epoch") != F.col("txn_epoch")))
            .select(
                *_tp(),
                "base_offset",
                "producer_id",
                "producer_epoch",
                "txn_epoch",
                "marker_epoch",
                "transactional_id",
            )
        )

    def epoch_order(self) -> DataFrame:
        earlier = (
            Window.partitionBy("topic", "partition", "producer_id")
            .orderBy("base_offset")
            .rowsBetween(Window.unboundedPreceding, -1)
        )
        return (
            self.batches.where(F.col("producer_id") >= 0)
            .withColumn("max_before", F.max("producer_epoch").over(earlier))
            .where(F.col("producer_epoch") < F.col("max_before"))
            .select(*_tp(), "base_offset", "producer_id", "producer_epoch", "max_before", "control")
        )

    def leader_epoch_order(self) -> DataFrame:
        """Each batch carries the leader epoch its leader appended it at, and
        leader epochs only grow: a batch below an earlier one's was appended
        by a deposed leader (or the log was spliced)."""
        earlier = (
            Window.partitionBy("topic", "partition")
            .orderBy("base_offset")
            .rowsBetween(Window.unboundedPreceding, -1)
        )
        return (
            self.batches.withColumn("max_before", F.max("leader_epoch").over(earlier))
            .where(F.col("leader_epoch") < F.col("max_before"))
            .select(*_tp(), "base_offset", "leader_epoch", "max_before", "control")
        )

    def inconsistent_offsets(self) -> DataFrame:
        seen = self.records.select(*_tp(), "offset", "value", F.lit("log").alias("source"))
        if self.history is not None:
            sends = self.completions.where(
                (F.col("op") == "send") & (F.col("type") == "ok") & (F.col("offset") >= 0)
            ).select(
                F.col("inv_topic").alias("topic"),
                F.col("inv_partition").alias("partition"),
                "offset",
                F.col("inv_value").alias("value"),
                F.lit("send").alias("source"),
            )
            reads = self._all_reads().select(*_tp(), "offset", "value", "source")
            seen = seen.unionByName(sends).unionByName(reads)
        return (
            seen.groupBy(*_tp(), "offset")
            .agg(
                F.countDistinct("value").alias("n"),
                F.collect_set(F.struct("value", "source")).alias("values"),
            )
            .where("n > 1")
            .drop("n")
        )

    def _poller_pairs(self) -> DataFrame:
        order = Window.partitionBy("process", "topic", "partition").orderBy("index", "pos")
        return (
            self.poll_reads.where(F.col("process").startswith("poller-"))
            .withColumn("prev_offset", F.lag("offset").over(order))
            .withColumn("prev_index", F.lag("index").over(order))
            .where(F.col("prev_offset").isNotNull())
        )

    def nonmonotonic_poll(self) -> DataFrame | str:
        if (why := self._needs_history()) is not None:
            return why
        return (
            self._poller_pairs()
            .where(F.col("offset") <= F.col("prev_offset"))
            .select("process", "index", "prev_index", *_tp(), "prev_offset", "offset")
        )

    def skipped_poll(self) -> DataFrame | str:
        """Between two successive read_committed reads of a partition by a poller, at
        offsets a then b, no record the logs show visible has an offset in (a, b),
        whether or not a and b are themselves visible records."""
        if (why := self._needs_history()) is not None:
            return why
        pairs = self._poller_pairs().where(
            (F.col("isolation") == "read_committed") & F.col("offset").isNotNull()
        )
        # How many visible records lie below (lt) and at or below (le) each read offset.
        points = (
            self.visible.select(*_tp(), "offset", F.lit(1).alias("vis"))
            .unionByName(pairs.select(*_tp(), "offset", F.lit(0).alias("vis")))
            .unionByName(
                pairs.select(*_tp(), F.col("prev_offset").alias("offset"), F.lit(0).alias("vis"))
            )
        )
        by_offset = Window.partitionBy(*_tp()).orderBy("offset")
        below = by_offset.rangeBetween(Window.unboundedPreceding, -1)
        upto = by_offset.rangeBetween(Window.unboundedPreceding, 0)
        counts = points.select(
            *_tp(),
            "offset",
            F.coalesce(F.sum("vis").over(below), F.lit(0)).alias("lt"),
            F.coalesce(F.sum("vis").over(upto), F.lit(0)).alias("le"),
        ).distinct()
        return (
            pairs.join(counts.select(*_tp(), "offset", "lt"), [*_tp(), "offset"])
            .join(
                counts.select(*_tp(), F.col("offset").alias("prev_offset"), "le"),
                [*_tp(), "prev_offset"],
            )
            .where(F.col("lt") > F.col("le"))
            .select(
                "process",
                "index",
                *_tp(),
                "prev_offset",
                "offset",
                (F.col("lt") - F.col("le")).alias("visible_skipped"),
            )
        )

    def replica_divergence(self) -> DataFrame:
        """Replicas of a shard that applied different transitions at one Raft entry, an
        entry missing from a replica that applied entries after it, or entries applied
        out of order. A replica's last entry may be cut short by a crash (the lines of
        one entry are one write): it must be a prefix of the others' version of it."""
        tr = self.replica_transitions
        last = tr.groupBy("node", "shard").agg(F.max("index").alias("last"))
        per_replica = (
            tr.groupBy("shard", "index", "node")
            .agg(
                F.transform(
                    F.array_sort(F.collect_list(F.struct("pos", "text"))), lambda s: s["text"]
                ).alias("applied")
            )
            .join(last, ["node", "shard"])
            .withColumn("partial", F.col("index") == F.col("last"))
        )
        entry = Window.partitionBy("shard", "index")
        whole = F.when(~F.col("partial"), F.col("applied"))
        judged = (
            per_replica.withColumn("versions", F.size(F.collect_set(whole).over(entry)))
            .withColumn(
                "reference",
                F.coalesce(
                    F.first(whole, True).over(entry),
                    F.max_by("applied", F.size("applied")).over(entry),
                ),
            )
            .withColumn(
                "bad",
                (F.col("versions") > 1)
                | (
                    F.col("partial")
                    & (F.slice("reference", 1, F.size("applied")) != F.col("applied"))
                ),
            )
        )
        differ = (
            judged.groupBy("shard", "index")
            .agg(
                F.max("bad").alias("bad"),
                F.collect_list(F.struct("node", "applied")).alias("replicas"),
            )
            .where("bad")
            .select(
                F.lit("different transitions").alias("problem"),
                "shard",
                "index",
                F.col("replicas").cast("string").alias("detail"),
            )
        )
        applied = tr.select("node", "shard", "index").distinct()
        # The entries a snapshot brought a replica: after its line before the marker,
        # up to the marker's index.
        earlier = self.snapshot_markers.join(
            tr.select("node", "shard", F.col("line").alias("t_line"), F.col("index").alias("t")),
            ["node", "shard"],
            "left",
        )
        by_snapshot = (
            earlier.where(F.col("t_line").isNull() | (F.col("t_line") < F.col("line")))
            .groupBy("node", "shard", "line", "index")
            .agg(F.coalesce(F.max("t"), F.lit(-1)).alias("after"))
            .select(
                F.col("node").alias("s_node"),
                F.col("shard").alias("s_shard"),
                "after",
                F.col("index").alias("upto"),
            )
        )
        holes = (
            applied.select("shard", "index")
            .distinct()
            .join(last, "shard")
            .where(F.col("index") < F.col("last"))
            .join(applied, ["node", "shard", "index"], "left_anti")
            .join(
                by_snapshot,
                (F.col("s_node") == F.col("node"))
                & (F.col("s_shard") == F.col("shard"))
                & (F.col("index") > F.col("after"))
                & (F.col("index") <= F.col("upto")),
                "left_anti",
            )
            .select(
                F.lit("entry missing from a replica").alias("problem"),
                "shard",
                "index",
                F.format_string(
                    "node %d applied entries up to %d without it", "node", "last"
                ).alias("detail"),
            )
        )
        order = Window.partitionBy("node", "shard").orderBy("line")
        backwards = (
            tr.withColumn("prev", F.lag("index").over(order))
            .where(F.col("index") < F.col("prev"))
            .select(
                F.lit("entries applied out of order").alias("problem"),
                "shard",
                "index",
                F.format_string("node %d applied %d after %d", "node", "index", "prev").alias(
                    "detail"
                ),
            )
        )
        return differ.unionByName(holes).unionByName(backwards).unionByName(self._log_divergence())

    def _log_divergence(self) -> DataFrame:
        """Records of a partition replica that differ from the newest leader's
        replica at the same offset where both batches carry the same leader
        epoch (one leader appended them: they must be the same records). A
        replica may hold other records at an offset under an older epoch: a
        tail its leader never acknowledged, which it cuts when it fetches
        again (KIP-101)."""
        columns = ["offset", "leader_epoch", "producer_id", "key", "value", "control_type"]
        records = self.replica_segments.where(
            F.col("record_index").isNotNull() & F.col("magic").isNotNull()
        ).select(*_tp(), "node", *columns)
        reference = self.segments.where(
            F.col("record_index").isNotNull() & F.col("magic").isNotNull()
        ).select(
            *_tp(),
            F.col("node").alias("ref_node"),
            "offset",
            "leader_epoch",
            *[F.col(c).alias(f"ref_{c}") for c in columns[2:]],
        )
        same = F.lit(True)
        for c in columns[2:]:
            same = same & F.col(c).eqNullSafe(F.col(f"ref_{c}"))
        return (
            records.join(reference, [*_tp(), "offset", "leader_epoch"])
            .where((F.col("node") != F.col("ref_node")) & ~same)
            .select(
                F.lit("partition replicas differ").alias("problem"),
                F.lit(None).cast("int").alias("shard"),
                F.col("offset").alias("index"),
                F.format_string(
                    "%s-%d at offset %d, leader epoch %d: node %d holds value %s, "
                    "node %d (the newest leader's) %s",
                    "topic",
                    "partition",
                    "offset",
                    "leader_epoch",
                    "node",
                    F.coalesce("value", F.lit("null")),
                    "ref_node",
                    F.coalesce("ref_value", F.lit("null")),
                ).alias("detail"),
            )
        )

    def exactly_once_pipeline(self) -> DataFrame | str:
        if (why := self._needs_history()) is not None:
            return why
        if not self.input_topic or not self.output_topic:
            return "the history names no input and output topics"
        if not self.has_final:
            return "the history has no final read"
        source_t = self.input_topic
        committed = self._committed_offsets()
        outputs = self._visible_outputs()
        made = outputs.select(
            F.col("source.topic").alias("topic"),
            F.col("source.partition").alias("partition"),
            F.col("source.offset").alias("offset"),
        ).distinct()
        consumed = self._consumed_inputs(committed)
        untransformed = consumed.join(made, [*_tp(), "offset"], "left_anti").select(
            F.lit("consumed input without an output").alias("problem"),
            *_tp(),
            "offset",
            "value",
        )
        beyond = (
            outputs.where(F.col("source").isNull() | (F.col("source.topic") != source_t))
            .select(
                F.lit("output not made from an input").alias("problem"), *_tp(), "offset", "value"
            )
            .unionByName(
                outputs.join(
                    committed.select(
                        F.col("topic").alias("st"),
                        F.col("partition").alias("sp"),
                        "next_offset",
                    ),
                    (F.col("source.topic") == F.col("st"))
                    & (F.col("source.partition") == F.col("sp")),
                    "left",
                )
                .where(
                    F.col("source").isNotNull()
                    & (F.col("source.topic") == source_t)
                    & (
                        F.col("next_offset").isNull()
                        | (F.col("source.offset") >= F.col("next_offset"))
                    )
                )
                .select(
                    F.lit("output of an input beyond the committed offset").alias("problem"),
                    *_tp(),
                    "offset",
                    "value",
                )
            )
        )
        held = self.records.where(F.col("topic") == source_t).select(
            F.col("topic").alias("it"),
            F.col("partition").alias("ip"),
            F.col("offset").alias("io"),
            F.col("value").alias("input_value"),
            F.col("visible").alias("input_visible"),
        )
        not_held = (
            outputs.where(F.col("source.topic") == source_t)
            .join(
                held,
                (F.col("source.topic") == F.col("it"))
                & (F.col("source.partition") == F.col("ip"))
                & (F.col("source.offset") == F.col("io")),
                "left",
            )
            .select(
                F.when(F.col("io").isNull(), "output of an input the log does not hold")
                .when(
                    F.col("input_value") != F.col("source.value"),
                    "output of an input whose offset holds another value",
                )
                .when(~F.col("input_visible"), "output of an input that is not visible")
                .alias("problem"),
                *_tp(),
                "offset",
                "value",
            )
            .where(F.col("problem").isNotNull())
        )
        ends = self.ends.where(F.col("topic") == source_t).join(committed, _tp(), "full")
        not_at_end = ends.where(
            F.coalesce("end", F.lit(0)) != F.coalesce("next_offset", F.lit(0))
        ).select(
            F.lit("committed offset not at the input's end").alias("problem"),
            *_tp(),
            F.col("next_offset").alias("offset"),
            F.format_string(
                "log end %s", F.coalesce(F.col("end").cast("string"), F.lit("none"))
            ).alias("value"),
        )
        return untransformed.unionByName(beyond).unionByName(not_held).unionByName(not_at_end)

    def _committed_offsets(self) -> DataFrame:
        """The workers' committed offsets of the final event: (topic, partition,
        next_offset), ``next_offset`` null where the group committed none."""
        return self.final.select(F.explode("committed").alias("tp", "next_offset")).select(
            F.split("tp", "/").getItem(0).alias("topic"),
            F.split("tp", "/").getItem(1).cast("int").alias("partition"),
            "next_offset",
        )

    def _consumed_inputs(self, committed: DataFrame) -> DataFrame:
        """The visible input records below the workers' committed offsets."""
        return (
            self.visible.where(F.col("topic") == F.lit(self.input_topic))
            .join(committed, _tp())
            .where(F.col("offset") < F.col("next_offset"))
        )

    def order(self) -> DataFrame:
        """Per partition, each producer's records in the order it sent them. From the
        logs: the data batches of one producer id and epoch have increasing base
        sequences (a repeated sequence is a batch written twice: a ``duplicate``).
        From the history: each process's visible writes to a partition are at offsets
        in the order of their sends, and the visible outputs of the workers' input
        partition are in the order of their inputs' offsets."""
        by_producer = Window.partitionBy(
            "topic", "partition", "producer_id", "producer_epoch"
        ).orderBy("base_offset")
        # A sequence wraps to 0 after the previous batch reached 2^31 - 1.
        wrapped = (F.col("base_sequence") == 0) & (
            F.col("prev") + F.col("prev_count") > _SEQUENCE_MAX
        )
        found = (
            self.batches.where(
                ~F.col("control") & (F.col("producer_id") >= 0) & (F.col("base_sequence") >= 0)
            )
            .withColumn("prev", F.lag("base_sequence").over(by_producer).cast("long"))
            .withColumn("prev_count", F.lag("record_count").over(by_producer))
            .where((F.col("base_sequence") < F.col("prev")) & ~wrapped)
            .select(
                F.lit("sequence").alias("kind"),
                *_tp(),
                F.col("base_offset").alias("offset"),
                F.format_string(
                    "producer %d epoch %d: base sequence %d after %d",
                    "producer_id",
                    "producer_epoch",
                    "base_sequence",
                    "prev",
                ).alias("detail"),
            )
        )
        if self.history is None:
            return found
        first_offset = self.visible.groupBy(*_tp(), "value").agg(F.min("offset").alias("offset"))
        by_sender = Window.partitionBy("process", "topic", "partition").orderBy("index")
        sends = (
            self.sends.join(first_offset, [*_tp(), "value"])
            .withColumn("prev_offset", F.lag("offset").over(by_sender))
            .withColumn("prev_value", F.lag("value").over(by_sender))
            .where(F.col("offset") < F.col("prev_offset"))
            .select(
                F.lit("send order").alias("kind"),
                *_tp(),
                "offset",
                F.format_string(
                    "%s sent %s before %s, written at offsets %d and %d",
                    "process",
                    "prev_value",
                    "value",
                    "prev_offset",
                    "offset",
                ).alias("detail"),
            )
        )
        found = found.unionByName(sends)
        if self.input_topic:
            by_output = Window.partitionBy("topic", "partition", "source_partition").orderBy(
                "offset"
            )
            outputs = (
                self._visible_outputs()
                .where(F.col("source.topic") == self.input_topic)
                .withColumn("source_partition", F.col("source.partition"))
                .withColumn("source_offset", F.col("source.offset"))
                .withColumn("prev_source", F.lag("source_offset").over(by_output))
                .where(F.col("source_offset") < F.col("prev_source"))
                .select(
                    F.lit("outputs out of their inputs' order").alias("kind"),
                    *_tp(),
                    "offset",
                    F.format_string(
                        "output of input %s/%d offset %d after one of offset %d",
                        F.col("source.topic"),
                        "source_partition",
                        "source_offset",
                        "prev_source",
                    ).alias("detail"),
                )
            )
            found = found.unionByName(outputs)
        return found

    def unseen(self) -> DataFrame | str:
        if (why := self._needs_history()) is not None:
            return why
        if not self.has_pollers:
            return "the history has no pollers"
        pollers = self.poll_reads.where(F.col("process").startswith("poller-"))
        committed = self.writes.where(F.col("outcome") == "committed").select(
            "txn", *_tp(), "value"
        )
        return committed.join(pollers.select(*_tp(), "value"), [*_tp(), "value"], "left_anti")

    def liveness(self) -> DataFrame:
        last = Window.partitionBy("transactional_id").orderBy(
            F.col("index").desc(), F.col("pos").desc()
        )
        stuck = (
            self.unique_transitions.withColumn("n", F.row_number().over(last))
            .where((F.col("n") == 1) & F.col("to_state").startswith("PREPARE_"))
            .select(
                F.lit("coordinator").alias("where"),
                F.col("transactional_id").alias("transaction"),
                F.format_string("left in %s (epoch %d)", "to_state", "producer_epoch").alias(
                    "detail"
                ),
            )
        )
        txn_status = (
            self.data_batches.where(F.col("status") != "PLAIN")
            .groupBy("producer_id", "producer_epoch", "txn_key")
            .agg(F.collect_set("status").alias("statuses"))
        )
        open_in_logs = txn_status.where(
            F.array_contains("statuses", "OPEN") & ~F.array_contains("statuses", "COMMITTED")
        ).select(
            F.lit("logs").alias("where"),
            _transaction_name().alias("transaction"),
            F.lit("data with no marker after it").alias("detail"),
        )
        found = stuck.unionByName(open_in_logs)
        if self.history is not None:
            never_ended = (
                self.writes.where(F.col("outcome") == "open")
                .select("txn")
                .distinct()
                .select(
                    F.lit("history").alias("where"),
                    F.col("txn").alias("transaction"),
                    F.lit("no end (commit/abort completion)").alias("detail"),
                )
            )
            found = found.unionByName(never_ended)
        return found

    def unreadable_data(self) -> DataFrame:
        """Every row a source could not read, with its problem, except a torn tail that
        a crash explains: the last line of a transitions log, and the end of a
        partition's newest segment unless the node was restarted after it."""
        problems = self.replica_segments.where(F.col("problem").isNotNull())
        torn = F.col("problem").startswith("torn tail")
        segments = problems.where(~torn).select(
            F.concat_ws("/", F.lit("partition-node"), "node", "topic", "partition").alias("file"),
            F.coalesce("offset", "base_offset", "position").alias("at"),
            "problem",
        )
        transitions = self.transitions.where(F.col("problem").isNotNull() & ~torn).select(
            F.format_string("node-%d/shard-%d", "node", "shard").alias("file"),
            F.col("line").alias("at"),
            "problem",
        )
        found = segments.unionByName(transitions)
        if self.history is not None:
            found = found.unionByName(self._torn_tails_after_restarts(problems.where(torn)))
            found = found.unionByName(
                self.history.where(F.col("problem").isNotNull()).select(
                    F.lit("history").alias("file"), F.col("position").alias("at"), "problem"
                )
            )
        return found

    def _torn_tails_after_restarts(self, torn: DataFrame) -> DataFrame:
        """The torn tails of partitions whose node the history says was restarted at or
        after the last write known to precede the tail (the newest timestamp of the
        partition's batches, the torn batch's own when its header is whole): recovery
        at that restart would have cut it. Unknown (no timestamp at all): any restart
        of the node."""
        known = self.replica_batches.groupBy("topic", "partition", "node").agg(
            F.max("max_timestamp").alias("known")
        )
        stopped = F.get_json_object("info", "$.stopped")
        restarts = self.faults.where(
            (F.col("phase") == "end")
            & F.col("fault").isin(*_PLOG_RESTARTS)
            & (stopped.isNull() | (stopped != "false"))
        ).select(
            F.explode(F.from_json("targets", "array<int>")).alias("node"),
            F.col("time_ms").alias("restart_ms"),
        )
        return (
            torn.join(known, ["topic", "partition", "node"], "left")
            .withColumn("known", F.greatest("known", "max_timestamp"))
            .join(restarts, "node")
            .where(F.col("known").isNull() | (F.col("restart_ms") >= F.col("known")))
            .groupBy("node", "topic", "partition", "position", "base_offset", "problem", "known")
            .agg(F.max("restart_ms").alias("restart_ms"))
            .select(
                F.concat_ws("/", F.lit("partition-node"), "node", "topic", "partition").alias(
                    "file"
                ),
                F.coalesce("base_offset", "position").alias("at"),
                F.format_string(
                    "%s, but the node was restarted at %.0f, after the last write known "
                    "before it (%s): its recovery would have cut it",
                    "problem",
                    "restart_ms",
                    F.coalesce(F.col("known").cast("string"), F.lit("none")),
                ).alias("problem"),
            )
        )

    # --- shared pieces -----------------------------------------------------------------------

    def _all_reads(self) -> DataFrame:
        polls = self.poll_reads.select(*_tp(), "offset", "value", F.col("process").alias("source"))
        final = self.final_reads.select(*_tp(), "offset", "value", F.lit("final").alias("source"))
        return polls.unionByName(final)

    def _committed_reads(self) -> DataFrame:
        polls = self.poll_reads.where(F.col("isolation") == "read_committed").select(
            *_tp(), "offset", "value", F.col("process").alias("seen_in")
        )
        final = self.final_reads.select(*_tp(), "offset", "value", F.lit("final").alias("seen_in"))
        return polls.unionByName(final)

    def _visible_outputs(self) -> DataFrame:
        """Visible records with the input their send names (null for other writers)."""
        sources = self.writes.where(F.col("source").isNotNull()).select(*_tp(), "value", "source")
        made = self.visible.join(sources, [*_tp(), "value"], "left")
        if self.output_topic:
            return made.where(F.col("topic") == self.output_topic)
        return made.where(F.col("source").isNotNull())


def _transaction_name() -> Column:
    """``producer id/epoch``, and ``#number`` for a transaction of transactions v1."""
    return F.concat(
        F.concat_ws("/", "producer_id", "producer_epoch"),
        F.when(F.col("txn_key") >= 0, F.concat(F.lit("#"), F.col("txn_key"))).otherwise(F.lit("")),
    )


def _newest_replica(segments: DataFrame, batches: DataFrame) -> DataFrame:
    """The rows of one replica per partition: the one whose batches reach
    the highest leader epoch (the newest leader's log), then the longest,
    then the lowest node id. With one replica, every row."""
    ends = batches.groupBy(*_tp(), "node").agg(
        F.max("leader_epoch").alias("top_epoch"), F.max("last_offset").alias("end")
    )
    choice = Window.partitionBy(*_tp()).orderBy(
        F.col("top_epoch").desc(), F.col("end").desc(), F.col("node")
    )
    chosen = (
        ends.withColumn("rank", F.row_number().over(choice))
        .where(F.col("rank") == 1)
        .select(*_tp(), "node")
    )
    return segments.join(F.broadcast(chosen), [*_tp(), "node"], "left_semi")
