"""The analytics jobs: PySpark DataFrame transformations of archived lifecycle events into metric tables.

Every function takes the events DataFrame (analytics/events.py's columns plus `destination` and `date`)
and returns a DataFrame; nothing collects raw events to the driver. Definitions (docs/analytics.md):

- a message's *life* on a destination starts at an `enqueue` event and lasts until the next one (a dead
  letter retried back starts a new life); lives are numbered by a running count of enqueues in stream
  order (`event_ms`, `event_seq`), which is the true order of a destination's events (computed by one
  groupBy per message and a SQL fold over its events, `messages`; no window function);
- send→dispatch: first dispatch of the life − enqueue; dispatch→ack: the ack − the delivery (dispatch)
  just before it; send→ack: the ack − enqueue. Consumer: the dispatch's consumer for send→dispatch, the
  acking consumer otherwise. Percentiles are exact (Spark's `percentile` with frequencies over a value
  histogram, linear interpolation);
- redelivered: dispatches of a message already delivered before (`redeliveries` > 0, JMSRedelivered);
- a slow-consumer episode: a consumer's `slow`/`slow_consumer` events with gaps under EPISODE_GAP_MS.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

MINUTE_MS = 60_000
EPISODE_GAP_MS = 60_000
PERCENTILES = (0.5, 0.95, 0.99)
LATENCY_METRICS = ("send_to_dispatch", "dispatch_to_ack", "send_to_ack")


def _type(*names: str) -> Column:
    return F.col("type").isin(*names)


def _counters() -> dict[str, Column]:
    """Counter -> the events it counts. `evicted`: the topic pending-limit eviction's `evict` event
    (spec §8.5; no queue evicts, so it stays 0 until topics exist)."""
    return {
        "enqueued": _type("enqueue"),
        "dispatched": _type("dispatch"),
        "acked": _type("ack"),
        "redelivered": _type("dispatch") & (F.col("redeliveries") > 0),
        "expired": _type("expire"),
        "dead_lettered": _type("deadletter"),
        "discarded": _type("discard"),
        "evicted": _type("evict"),
    }


COUNTER_NAMES = ("enqueued", "dispatched", "acked", "redelivered", "expired", "dead_lettered", "discarded",
                 "evicted")
COUNTED_TYPES = ("enqueue", "dispatch", "ack", "expire", "deadletter", "discard", "evict")


def per_minute(events: DataFrame) -> DataFrame:
    """(destination, minute_ms, enqueued, dispatched, acked, redelivered, expired, dead_lettered,
    discarded, evicted): one row per destination and minute with at least one counted event."""
    counters = _counters()
    return (
        events.filter(_type(*COUNTED_TYPES))
        .withColumn("minute_ms", F.col("ts") - F.col("ts") % MINUTE_MS)
        .groupBy("destination", "minute_ms")
        .agg(*(F.sum(F.when(counters[name], 1).otherwise(0)).cast("long").alias(name)
               for name in COUNTER_NAMES))
    )


_LIFE = ("STRUCT<sent_ts: BIGINT, fd_ts: BIGINT, fd_consumer: STRING, ack_ts: BIGINT, ack_consumer: STRING, "
         "ack_delivered: BIGINT, maxr: BIGINT>")
# One fold over a message's enqueue/dispatch/ack events in stream order (k: 0 enqueue, 1 dispatch, 2 ack):
# `life` counts enqueues, `delivered` is the last dispatch's ts (across lives), `cur` the open life and
# `out` the closed ones. Events before the first enqueue (life 0) only move `delivered`.
_FOLD = f"""aggregate(array_sort(evs),
  named_struct('life', 0, 'delivered', CAST(NULL AS BIGINT), 'cur', CAST(NULL AS {_LIFE}),
               'out', CAST(array() AS ARRAY<{_LIFE}>)),
  (s, e) -> CASE
    WHEN e.k = 0 THEN named_struct('life', s.life + 1, 'delivered', s.delivered,
      'cur', CAST(named_struct('sent_ts', e.ts, 'fd_ts', NULL, 'fd_consumer', NULL, 'ack_ts', NULL,
                               'ack_consumer', NULL, 'ack_delivered', NULL, 'maxr', NULL) AS {_LIFE}),
      'out', IF(s.life > 0, concat(s.out, array(s.cur)), s.out))
    WHEN e.k = 1 THEN named_struct('life', s.life, 'delivered', e.ts,
      'cur', IF(s.life = 0, s.cur, named_struct('sent_ts', s.cur.sent_ts,
                'fd_ts', coalesce(s.cur.fd_ts, e.ts),
                'fd_consumer', IF(s.cur.fd_ts IS NULL, e.consumer, s.cur.fd_consumer),
                'ack_ts', s.cur.ack_ts, 'ack_consumer', s.cur.ack_consumer,
                'ack_delivered', s.cur.ack_delivered, 'maxr', greatest(s.cur.maxr, e.redeliveries))),
      'out', s.out)
    ELSE named_struct('life', s.life, 'delivered', s.delivered,
      'cur', IF(s.life = 0 OR s.cur.ack_ts IS NOT NULL, s.cur, named_struct('sent_ts', s.cur.sent_ts,
                'fd_ts', s.cur.fd_ts, 'fd_consumer', s.cur.fd_consumer, 'ack_ts', e.ts,
                'ack_consumer', e.consumer, 'ack_delivered', s.delivered, 'maxr', s.cur.maxr)),
      'out', s.out)
  END,
  s -> IF(s.life > 0, concat(s.out, array(s.cur)), s.out))"""


def messages(events: DataFrame) -> DataFrame:
    """One row per (destination, msg) with enqueue/dispatch/ack events: `lives` (array of life structs,
    in order: sent_ts, fd_ts, fd_consumer, ack_ts, ack_consumer, ack_delivered, maxr), `groups` (the
    distinct non-empty groups its enqueues carried) and `dispatched_to` (distinct struct(consumer) of its
    dispatches). One shuffle of the events by message, no window: the per-message events are folded in
    stream order (`event_ms`, `event_seq`) by a SQL higher-order function (no Python UDF)."""
    is_enqueue, is_dispatch = _type("enqueue"), _type("dispatch")
    kind = F.when(is_enqueue, 0).when(is_dispatch, 1).otherwise(2).cast("tinyint")
    per_message = (
        events.filter(_type("enqueue", "dispatch", "ack") & F.col("msg").isNotNull())
        .groupBy("destination", "msg")
        .agg(F.collect_list(F.struct("event_ms", "event_seq", kind.alias("k"), "ts", "consumer",
                                     "redeliveries")).alias("evs"),
             F.collect_set(F.when(is_enqueue & F.col("group").isNotNull() & (F.col("group") != ""),
                                  F.col("group"))).alias("groups"),
             F.collect_set(F.when(is_dispatch, F.struct("consumer"))).alias("dispatched_to"))
    )
    return per_message.select("destination", "msg", F.expr(_FOLD).alias("lives"), "groups", "dispatched_to")


def lives(events: DataFrame, per_message: DataFrame | None = None) -> DataFrame:
    """One row per message life: (destination, msg, life, sent_ts, first_dispatch, ack, max_redeliveries),
    first_dispatch = struct(ts, consumer), ack = struct(ts, consumer, delivered_ts) (nulls when absent).
    `per_message`: messages(events), when the caller already has it (the pipeline caches it)."""
    frame = messages(events) if per_message is None else per_message
    life = F.col("l")
    return (
        frame.select("destination", "msg", F.posexplode("lives").alias("pos", "l"))
        .select("destination", "msg", (F.col("pos") + 1).alias("life"), life["sent_ts"].alias("sent_ts"),
                F.when(life["fd_ts"].isNotNull(),
                       F.struct(life["fd_ts"].alias("ts"), life["fd_consumer"].alias("consumer")))
                .alias("first_dispatch"),
                F.when(life["ack_ts"].isNotNull(),
                       F.struct(life["ack_ts"].alias("ts"), life["ack_consumer"].alias("consumer"),
                                life["ack_delivered"].alias("delivered_ts"))).alias("ack"),
                life["maxr"].alias("max_redeliveries"))
    )


def latency_samples(message_lives: DataFrame) -> DataFrame:
    """(destination, consumer, metric, value_ms): one sample per life and metric (one pass, no union)."""
    sample = F.struct
    candidates = F.array(
        F.when(F.col("first_dispatch").isNotNull(),
               sample(F.col("first_dispatch.consumer").alias("consumer"),
                      F.lit("send_to_dispatch").alias("metric"),
                      (F.col("first_dispatch.ts") - F.col("sent_ts")).alias("value_ms"))),
        F.when(F.col("ack.delivered_ts").isNotNull(),
               sample(F.col("ack.consumer").alias("consumer"), F.lit("dispatch_to_ack").alias("metric"),
                      (F.col("ack.ts") - F.col("ack.delivered_ts")).alias("value_ms"))),
        F.when(F.col("ack").isNotNull(),
               sample(F.col("ack.consumer").alias("consumer"), F.lit("send_to_ack").alias("metric"),
                      (F.col("ack.ts") - F.col("sent_ts")).alias("value_ms"))),
    )
    present = F.filter(candidates, lambda s: s.isNotNull())
    return (message_lives.select("destination", F.explode(present).alias("s"))
            .select("destination", "s.consumer", "s.metric", "s.value_ms"))


def latency(samples: DataFrame) -> DataFrame:
    """(destination, consumer, metric, count, p50, p95, p99); consumer is null on the destination's rows.
    Exact percentiles from a histogram: the samples are counted per distinct value first (latencies in ms
    repeat a lot), then `percentile(value, p, frequency)` interpolates exactly as over the raw samples."""
    histogram = samples.groupBy("destination", "consumer", "metric", "value_ms").agg(
        F.count("*").alias("n"))

    def summarise(frame: DataFrame, keys: list[str]) -> DataFrame:
        quantiles = F.percentile(F.col("value_ms").cast("double"), list(PERCENTILES), F.col("n"))
        return frame.groupBy(*keys, "metric").agg(F.sum("n").alias("count"), quantiles.alias("q")).select(
            *keys, "metric", "count", F.col("q")[0].alias("p50"), F.col("q")[1].alias("p95"),
            F.col("q")[2].alias("p99"))

    per_destination = summarise(histogram, ["destination"]).withColumn("consumer", F.lit(None).cast("string"))
    per_consumer = summarise(histogram.filter(F.col("consumer").isNotNull()), ["destination", "consumer"])
    return per_destination.unionByName(per_consumer)


def redelivery_distribution(message_lives: DataFrame) -> DataFrame:
    """(destination, redeliveries, messages): delivered message lives by the redelivery counter of their
    last delivery."""
    return (message_lives.filter(F.col("max_redeliveries").isNotNull())
            .groupBy("destination", F.col("max_redeliveries").alias("redeliveries"))
            .agg(F.count("*").alias("messages")))


def dead_letter_causes(events: DataFrame) -> DataFrame:
    """(destination, outcome [deadletter | discard], cause, target, count, sample_detail)."""
    return (events.filter(_type("deadletter", "discard"))
            .groupBy("destination", F.col("type").alias("outcome"), "cause", "target")
            .agg(F.count("*").alias("count"), F.min("detail").alias("sample_detail")))


def _grouped_messages(events: DataFrame) -> DataFrame:
    # '' is what the enqueue event carries for a message without a group.
    return (events.filter(_type("enqueue") & F.col("group").isNotNull() & (F.col("group") != ""))
            .select("destination", "msg", "group").distinct())


def groups(events: DataFrame) -> DataFrame:
    """(destination, group, messages, assignments, owner_changes, owner): per message group, the messages
    enqueued, how often it was assigned and to a different consumer than before, and its owner at the end
    of the range (null when freed: closed, evicted, reset, or its owner was removed)."""
    messages = (events.filter(_type("enqueue") & F.col("group").isNotNull() & (F.col("group") != ""))
                .groupBy("destination", "group").agg(F.count("*").alias("messages")))
    position = F.struct("event_ms", "event_seq")
    assigns = events.filter(_type("group_assign"))
    by_group = Window.partitionBy("destination", "group").orderBy("event_ms", "event_seq")
    assigned = (
        assigns.withColumn("previous", F.lag("consumer").over(by_group))
        .groupBy("destination", "group")
        .agg(F.count("*").alias("assignments"),
             F.sum(F.when(F.col("previous").isNotNull() & (F.col("previous") != F.col("consumer")), 1)
                   .otherwise(0)).cast("long").alias("owner_changes"),
             F.max(F.struct(position.alias("at"), "consumer")).alias("last_assign"))
    )
    freed_group = (events.filter(_type("group_close", "group_evict", "group_reset") & (F.col("group") != "*"))
                   .groupBy("destination", "group").agg(F.max(position).alias("freed_at")))
    reset_all = (events.filter(_type("group_reset") & (F.col("group") == "*"))
                 .groupBy("destination").agg(F.max(position).alias("reset_all_at")))
    removed = (events.filter(_type("consumer_remove"))
               .groupBy("destination", "consumer").agg(F.max(position).alias("removed_at")))
    at = F.col("last_assign.at")
    # The last assignee still owns the group unless it was freed, all groups were reset, or the consumer
    # was removed (closing a consumer frees its groups without group_close events) after that assignment.
    owned = (assigned.join(freed_group, ["destination", "group"], "left")
             .join(reset_all, ["destination"], "left"))
    owned = owned.withColumn("owner_candidate", F.col("last_assign.consumer")).join(
        removed.withColumnRenamed("consumer", "owner_candidate"), ["destination", "owner_candidate"], "left")
    still_owned = ((F.col("freed_at").isNull() | (at > F.col("freed_at")))
                   & (F.col("reset_all_at").isNull() | (at > F.col("reset_all_at")))
                   & (F.col("removed_at").isNull() | (at > F.col("removed_at"))))
    owned = owned.select("destination", "group", "assignments", "owner_changes",
                         F.when(still_owned, F.col("owner_candidate")).alias("owner"))
    return (messages.join(owned, ["destination", "group"], "full")
            .select("destination", "group", F.coalesce("messages", F.lit(0)).alias("messages"),
                    F.coalesce("assignments", F.lit(0)).alias("assignments"),
                    F.coalesce("owner_changes", F.lit(0)).alias("owner_changes"), "owner"))


def group_consumers(events: DataFrame, per_message: DataFrame | None = None) -> DataFrame:
    """(destination, consumer, groups, messages): per consumer, the distinct groups and grouped messages
    dispatched to it. From messages(events) (one row per message: its groups and the consumers it was
    dispatched to), so no join of the dispatches with the grouped messages."""
    frame = messages(events) if per_message is None else per_message
    return (frame.filter(F.size("groups") > 0)
            .select("destination", "groups", F.explode("dispatched_to.consumer").alias("consumer"))
            .groupBy("destination", "consumer")
            .agg(F.size(F.array_distinct(F.flatten(F.collect_list("groups")))).cast("long").alias("groups"),
                 F.count("*").alias("messages")))


def active_consumers(events: DataFrame) -> DataFrame:
    """(destination, consumer): consumers seen in the range whose last add/remove was not a removal."""
    position = F.struct("event_ms", "event_seq")
    seen = events.filter(F.col("consumer").isNotNull() & _type("consumer_add", "dispatch", "ack",
                                                                 "group_assign", "consumer_remove"))
    return (seen.groupBy("destination", "consumer")
            .agg(F.max(F.when(_type("consumer_remove"), position)).alias("removed_at"),
                 F.max(F.when(_type("consumer_add"), position)).alias("added_at"))
            .filter(F.col("removed_at").isNull() | (F.col("added_at") > F.col("removed_at")))
            .select("destination", "consumer"))


def slow_consumer_episodes(events: DataFrame, gap_ms: int = EPISODE_GAP_MS) -> DataFrame:
    """(destination, consumer, episode, start_ts, end_ts, signals): runs of a consumer's slow signals
    with gaps under gap_ms."""
    by_consumer = Window.partitionBy("destination", "consumer").orderBy("ts", "event_ms", "event_seq")
    marks = events.filter(_type("slow", "slow_consumer") & F.col("consumer").isNotNull()).select(
        "destination", "consumer", "ts", "event_ms", "event_seq")
    starts = marks.withColumn("previous", F.lag("ts").over(by_consumer)).withColumn(
        "starts", F.when(F.col("previous").isNull() | (F.col("ts") - F.col("previous") >= gap_ms), 1)
        .otherwise(0))
    running = by_consumer.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    numbered = starts.withColumn("episode", F.sum("starts").over(running))
    return (numbered.groupBy("destination", "consumer", "episode")
            .agg(F.min("ts").alias("start_ts"), F.max("ts").alias("end_ts"), F.count("*").alias("signals")))


def aborts(events: DataFrame) -> DataFrame:
    """(destination, consumer, ts, reason, strategy, abort_connection) of every consumer abort."""
    return events.filter(_type("abort")).select(
        "destination", "consumer", "ts", "reason", "strategy",
        (F.col("attrs")["abort_connection"] == "1").alias("abort_connection"))
