"""The analytics jobs: PySpark DataFrame transformations of archived lifecycle events into metric tables.

Every function takes the events DataFrame (analytics/events.py's columns plus `destination` and `date`)
and returns a DataFrame; nothing collects raw events to the driver. Definitions (docs/analytics.md):

- a message's *life* on a destination starts at an `enqueue` event and lasts until the next one (a dead
  letter retried back starts a new life); lives are numbered by a running count of enqueues in stream
  order (`event_ms`, `event_seq`), which is the true order of a destination's events. On a topic each
  subscription's copy has its own lives (COPY, _bulk). Computed by one
  hash aggregate per message of plain aggregates (`messages`: min/max/min_by/max_by over positions,
  consumer and group names as 64-bit keys, no per-message list), which is exactly the life of a message
  with one enqueue as its first event; the few other messages fold their events in stream order
  (`complex_messages`); no window function;
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
    """Counter -> what an event adds to it (null: nothing). `expired` and `expired_on_arrival` apart, as the
    broker counts them (a message expired when sent is never enqueued, and ActiveMQ's Queue.send does not
    count it in the destination's ExpiredCount; Topic.send, and Queue.send's send that waited for space, do:
    the event's `counted`). `evicted`: the topic pending-limit eviction's
    `evict` event (spec §8.5). `lost`: the events the stream's cap dropped before the archive read them
    (the archive's `lost` rows, each with their `count`): the other counters miss that many events."""
    def one(condition: Column) -> Column:
        return F.when(condition, 1)

    on_arrival = F.coalesce(F.col("attrs")["on_arrival"] == "1", F.lit(False))
    counted = F.coalesce(F.col("attrs")["counted"] == "1", F.lit(False))  # (on arrival, and in `expired` too)

    return {
        "enqueued": one(_type("enqueue")),
        "dispatched": one(_type("dispatch")),
        "acked": one(_type("ack")),
        "redelivered": one(_type("dispatch") & (F.col("redeliveries") > 0)),
        "expired": one(_type("expire") & (~on_arrival | counted)),
        "expired_on_arrival": one(_type("expire") & on_arrival),
        "dead_lettered": one(_type("deadletter")),
        "discarded": one(_type("discard")),
        "evicted": one(_type("evict")),
        "lost": F.when(_type("lost"), F.col("count")),
    }


COUNTER_NAMES = ("enqueued", "dispatched", "acked", "redelivered", "expired", "expired_on_arrival",
                 "dead_lettered", "discarded", "evicted", "lost")
COUNTED_TYPES = ("enqueue", "dispatch", "ack", "expire", "deadletter", "discard", "evict", "lost")


def per_minute(events: DataFrame) -> DataFrame:
    """(destination, minute_ms, enqueued, dispatched, acked, redelivered, expired, expired_on_arrival,
    dead_lettered, discarded, evicted, lost): one row per destination and minute with at least one counted
    event."""
    counters = _counters()
    return (
        events.filter(_type(*COUNTED_TYPES))
        .withColumn("minute_ms", F.col("ts") - F.col("ts") % MINUTE_MS)
        .groupBy("destination", "minute_ms")
        .agg(*(F.coalesce(F.sum(counters[name]), F.lit(0)).cast("long").alias(name)
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


# A stream position as one long, ordered as (event_ms, event_seq): event_ms * 2^20 + event_seq. Exact while
# event_seq < 2^20 (1,024 entries in one millisecond of one stream: events.SEQ_PER_ENTRY) and event_ms < 2^43
# (year 2248); a message with an event outside that is never "simple" and takes the fold (no overflow: the
# position is null there).
_SEQ_BITS = 20
_MAX_EVENT_MS = 1 << 43
# complex_messages broadcasts the keys of up to this many messages to pick their events.
BROADCAST_KEYS = 200_000
# key_salt tries this many salts before giving up (two names sharing a 64-bit key under each of them).
KEY_SALTS = 8


class KeyCollisionError(RuntimeError):
    """Two consumer or group names of one destination share a 64-bit key under every salt tried."""


def _position() -> Column:
    packable = (F.col("event_seq").between(0, (1 << _SEQ_BITS) - 1)
                & F.col("event_ms").between(0, _MAX_EVENT_MS - 1))
    return F.when(packable, F.col("event_ms") * (1 << _SEQ_BITS) + F.col("event_seq"))


def key(column: str | Column, salt: int) -> Column:
    """The 64-bit key of a consumer or group name (null for null). The per-message aggregate carries keys
    instead of strings so that it stays a hash aggregate over fixed-width buffers (a string min/max turns
    it into a sort aggregate); key_salt picks a salt under which keys are unique per destination, so
    counting and decoding keys is exact."""
    name = F.col(column) if isinstance(column, str) else column
    return F.when(name.isNotNull(), F.xxhash64(name, F.lit(salt)))


# A message's copy, the thing that lives: on a queue the message (`sub` ''), on a topic one subscription's
# copy of it (`sub` = the subscription key its dispatch and ack events carry).
COPY = ("destination", "msg", "sub")


def _bulk(events: DataFrame) -> DataFrame:
    """The enqueue/dispatch/ack events, each with its copy's `sub`. A topic's stream holds one `enqueue` per
    message and every subscription's dispatches and acks (docs/broker_core.md, *Lifecycle events*): the
    enqueue is given to each subscription that has events of the message (kept once, `sub` '', when none
    has), so that each subscription's copy has its own life; folded into one, the first subscription's ack
    was the only ack, measured from the last subscription's dispatch. Queues' events pass as they are."""
    bulk = events.filter(_type("enqueue", "dispatch", "ack") & F.col("msg").isNotNull())
    # (`destination` is a partition column: each side reads only its own folders, and queues' events never
    # decode `attrs`)
    on_topic = F.col("destination").startswith("topic://")
    queues = bulk.filter(~on_topic).withColumn("sub", F.lit(""))
    topic = bulk.filter(on_topic).withColumn("sub", F.coalesce(F.col("attrs")["sub"], F.lit("")))
    subs = topic.filter(F.col("sub") != "").select(*COPY).distinct()
    enqueues = (topic.filter(_type("enqueue")).drop("sub").join(subs, ["destination", "msg"], "left")
                .withColumn("sub", F.coalesce("sub", F.lit(""))))
    return (queues.unionByName(topic.filter(~_type("enqueue")))
            .unionByName(enqueues.select(*queues.columns)))


def _grouped_enqueue() -> Column:
    # '' is what the enqueue event carries for a message without a group (the archive stores it as null).
    return _type("enqueue") & F.col("group").isNotNull() & (F.col("group") != "")


def group_messages(events: DataFrame) -> DataFrame:
    """(destination, group, messages): the enqueues carrying each non-empty group."""
    return (events.filter(_grouped_enqueue()).groupBy("destination", "group")
            .agg(F.count("*").alias("messages")))


def consumers_seen(events: DataFrame) -> DataFrame:
    """(destination, consumer, removed_at, added_at): every consumer an add, dispatch, ack, group assignment
    or removal names, with the stream position of its last removal and last add (struct(event_ms,
    event_seq), null when none). The names behind the consumer keys, and active_consumers' input."""
    # The adds and removals (few) are aggregated apart: a struct max over every dispatch and ack would make
    # the aggregate sort-based; the bulk only contributes distinct names (a hash aggregate).
    position = F.struct("event_ms", "event_seq")
    named = events.filter(F.col("consumer").isNotNull())
    changes = (named.filter(_type("consumer_add", "consumer_remove")).groupBy("destination", "consumer")
               .agg(F.max(F.when(_type("consumer_remove"), position)).alias("removed_at"),
                    F.max(F.when(_type("consumer_add"), position)).alias("added_at")))
    none = F.lit(None).cast(changes.schema["added_at"].dataType)
    others = (named.filter(_type("dispatch", "ack", "group_assign")).select("destination", "consumer")
              .distinct().select("destination", "consumer", none.alias("removed_at"), none.alias("added_at")))
    return (changes.unionByName(others).groupBy("destination", "consumer")
            .agg(F.max("removed_at").alias("removed_at"), F.max("added_at").alias("added_at")))


def key_salt(seen: DataFrame, grouped: DataFrame) -> int:
    """The first salt under which no two consumers (consumers_seen) and no two groups (group_messages) of
    a destination share a key. One small job per salt tried (almost always one: a 64-bit collision among
    a destination's names)."""
    names = (seen.select("destination", F.lit("consumer").alias("kind"), F.col("consumer").alias("name"))
             .unionByName(grouped.select("destination", F.lit("group").alias("kind"),
                                         F.col("group").alias("name"))))
    for salt in range(KEY_SALTS):  # both inputs hold each name of a destination once
        clash = (names.groupBy("destination", "kind", key("name", salt).alias("key"))
                 .agg(F.count("*").alias("names")).filter(F.col("names") > 1))
        if not clash.limit(1).collect():
            return salt
    raise KeyCollisionError(f"consumer or group names share a 64-bit key under each of {KEY_SALTS} salts")


def consumer_names(seen: DataFrame, salt: int) -> DataFrame:
    """(destination, key, name): decodes the consumer keys of the keyed tables."""
    return seen.select("destination", key("consumer", salt).alias("key"), F.col("consumer").alias("name"))


def messages(events: DataFrame, salt: int = 0) -> DataFrame:
    """One row per (destination, msg) of the enqueue/dispatch/ack events, from plain aggregates only (one
    hash aggregate, no per-message list): enqueue count and position, sent_ts, group_key, the first
    dispatch (fd_ts, fd_consumer) and the last one (ld_pos, ld_ts), max_redeliveries, dispatches and the
    smallest/largest dispatch consumer key (d_min, d_max), the first ack (ack_pos, ack_ts, ack_consumer);
    consumers and groups as key(…, salt).

    `simple`: the message has exactly one life and these aggregates are that life: one enqueue, which is
    its first event; no dispatch after its first ack; every event's position packable; no dispatch
    without a consumer; at most two distinct dispatch consumers (d_min, d_max). Every other message
    with an enqueue (several lives, events before the enqueue, redelivered to three consumers, …) is
    folded event by event (complex_messages). Messages without an enqueue in the range have no life."""
    # Narrow rows (kind, position and keys as numbers) shuffled by message as they are: a partial
    # aggregation before the shuffle costs more than it saves (most messages' events are few).
    narrow = _bulk(events).select(
        *COPY, F.when(_type("enqueue"), 0).when(_type("dispatch"), 1).otherwise(2)
        .cast("tinyint").alias("kind"), _position().alias("pos"), "ts",
        key("consumer", salt).alias("consumer"),
        F.when(_grouped_enqueue(), key("group", salt)).alias("group_key"), "redeliveries")
    is_enqueue, is_dispatch, is_ack = (F.col("kind") == 0), (F.col("kind") == 1), (F.col("kind") == 2)
    pos, ts, consumer = F.col("pos"), F.col("ts"), F.col("consumer")
    return (
        narrow.repartition(*COPY).groupBy(*COPY).agg(
            F.count_if(is_enqueue).alias("enqueues"),
            F.max(F.when(is_enqueue, pos)).alias("enqueue_pos"),
            F.min(pos).alias("first_pos"),
            F.count_if(pos.isNull()).alias("unpackable"),
            F.max(F.when(is_enqueue, ts)).alias("sent_ts"),
            F.max("group_key").alias("group_key"),
            F.count_if(is_dispatch).alias("dispatches"),
            F.count_if(is_dispatch & consumer.isNull()).alias("anonymous_dispatches"),
            F.min_by(F.when(is_dispatch, ts), F.when(is_dispatch, pos)).alias("fd_ts"),
            F.min_by(F.when(is_dispatch, consumer), F.when(is_dispatch, pos)).alias("fd_consumer"),
            F.max(F.when(is_dispatch, pos)).alias("ld_pos"),
            F.max_by(F.when(is_dispatch, ts), F.when(is_dispatch, pos)).alias("ld_ts"),
            F.max(F.when(is_dispatch, F.col("redeliveries"))).alias("max_redeliveries"),
            F.min(F.when(is_dispatch, consumer)).alias("d_min"),
            F.max(F.when(is_dispatch, consumer)).alias("d_max"),
            F.min(F.when(is_ack, pos)).alias("ack_pos"),
            F.min_by(F.when(is_ack, ts), F.when(is_ack, pos)).alias("ack_ts"),
            F.min_by(F.when(is_ack, consumer), F.when(is_ack, pos)).alias("ack_consumer"),
        )
        .filter(F.col("enqueues") > 0)
        .withColumn("simple", (F.col("enqueues") == 1) & (F.col("enqueue_pos") == F.col("first_pos"))
                    & (F.col("unpackable") == 0) & (F.col("anonymous_dispatches") == 0)
                    & (F.col("ack_pos").isNull() | F.col("ld_pos").isNull()
                       | (F.col("ld_pos") < F.col("ack_pos")))
                    & ((F.col("dispatches") <= 2) | (F.col("d_min") == F.col("d_max"))))
    )


def complex_messages(events: DataFrame, keys: DataFrame) -> DataFrame:
    """(destination, msg, lives, groups, dispatched_to) of the messages `keys` (destination, msg) names,
    those that are not `simple` (small, cached by the pipeline): their events
    (a semi join with those few keys) collected and folded in stream order (`event_ms`, `event_seq`) by a
    SQL higher-order function into `lives` (array of sent_ts, fd_ts, fd_consumer, ack_ts, ack_consumer,
    ack_delivered, maxr), `groups` (distinct non-empty groups of its enqueues) and `dispatched_to`
    (distinct struct(consumer) of its dispatches); names, not keys.

    Counts `keys` first (one small job): with none,
    the events are not read again; up to BROADCAST_KEYS, their keys are broadcast (no shuffle of the
    events); more (many messages with several lives) take a shuffled semi join."""
    is_enqueue, is_dispatch = _type("enqueue"), _type("dispatch")
    kind = F.when(is_enqueue, 0).when(is_dispatch, 1).otherwise(2).cast("tinyint")
    count = keys.count()
    if count == 0:
        bulk = _bulk(events).filter(F.lit(False))  # an empty plan: Spark prunes the scan
    else:
        bulk = _bulk(events).join(F.broadcast(keys) if count <= BROADCAST_KEYS else keys,
                                  list(COPY), "left_semi")
    return (
        bulk.groupBy(*COPY)
        .agg(F.collect_list(F.struct("event_ms", "event_seq", kind.alias("k"), "ts", "consumer",
                                     "redeliveries")).alias("evs"),
             F.collect_set(F.when(_grouped_enqueue(), F.col("group"))).alias("groups"),
             F.collect_set(F.when(is_dispatch, F.struct("consumer"))).alias("dispatched_to"))
        .select(*COPY, F.expr(_FOLD).alias("lives"), "groups", "dispatched_to")
    )


def _life_row(life: Column, sent_ts: Column, fd_ts: Column, fd_consumer: Column, ack_ts: Column,
              ack_consumer: Column, delivered_ts: Column, max_redeliveries: Column) -> list[Column]:
    return [life.alias("life"), sent_ts.alias("sent_ts"),
            F.when(fd_ts.isNotNull(), F.struct(fd_ts.alias("ts"), fd_consumer.alias("consumer")))
            .alias("first_dispatch"),
            F.when(ack_ts.isNotNull(), F.struct(ack_ts.alias("ts"), ack_consumer.alias("consumer"),
                                                delivered_ts.alias("delivered_ts"))).alias("ack"),
            max_redeliveries.alias("max_redeliveries")]


def keyed_lives(per_message: DataFrame, folded: DataFrame, salt: int) -> DataFrame:
    """lives() with consumer keys instead of names: the simple messages' single life straight from their
    aggregates (the ack's delivery is the last dispatch, which comes before it), the others' lives from
    the fold."""
    simple = per_message.filter(F.col("simple")).select(
        *COPY,
        *_life_row(F.lit(1), F.col("sent_ts"), F.col("fd_ts"), F.col("fd_consumer"), F.col("ack_ts"),
                   F.col("ack_consumer"), F.col("ld_ts"), F.col("max_redeliveries")))
    life = F.col("l")
    folded_lives = folded.select(*COPY, F.posexplode("lives").alias("pos", "l")).select(
        *COPY,
        *_life_row(F.col("pos") + 1, life["sent_ts"], life["fd_ts"], key(life["fd_consumer"], salt),
                   life["ack_ts"], key(life["ack_consumer"], salt), life["ack_delivered"], life["maxr"]))
    return simple.unionByName(folded_lives)


def lives(events: DataFrame) -> DataFrame:
    """One row per message life: (destination, msg, life, sent_ts, first_dispatch, ack, max_redeliveries),
    first_dispatch = struct(ts, consumer), ack = struct(ts, consumer, delivered_ts) (nulls when absent).
    Builds what the pipeline builds (messages, complex_messages, keyed_lives) and decodes the consumers."""
    seen = consumers_seen(events)
    salt = key_salt(seen, group_messages(events))
    per_message = messages(events, salt)
    folded = complex_messages(events, per_message.filter(~F.col("simple")).select(*COPY))
    keyed = keyed_lives(per_message, folded, salt)
    names = consumer_names(seen, salt)
    first, acker = names.alias("first"), names.alias("acker")
    joined = (keyed.alias("l")
              .join(first, (F.col("l.destination") == F.col("first.destination"))
                    & (F.col("l.first_dispatch.consumer") == F.col("first.key")), "left")
              .join(acker, (F.col("l.destination") == F.col("acker.destination"))
                    & (F.col("l.ack.consumer") == F.col("acker.key")), "left"))
    return joined.select(
        "l.destination", "l.msg", "l.sub",
        *_life_row(F.col("l.life"), F.col("l.sent_ts"), F.col("l.first_dispatch.ts"), F.col("first.name"),
                   F.col("l.ack.ts"), F.col("acker.name"), F.col("l.ack.delivered_ts"),
                   F.col("l.max_redeliveries")))


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
    return _percentiles(samples.groupBy("destination", "consumer", "metric", "value_ms").agg(
        F.count("*").alias("n")))


def _percentiles(histogram: DataFrame) -> DataFrame:
    """latency()'s rows from (destination, consumer, metric, value_ms, n)."""
    # One pass over the histogram for both levels (grouping sets); grouping_id 1 = the destination's rows
    # (consumer not grouped, so null), 0 = per consumer (a sample without consumer counts only above).
    quantiles = F.percentile(F.col("value_ms").cast("double"), list(PERCENTILES), F.col("n"))
    levels = (histogram.groupingSets([["destination", "metric"], ["destination", "metric", "consumer"]],
                                     "destination", "metric", "consumer")
              .agg(F.sum("n").alias("count"), quantiles.alias("q"), F.grouping_id().alias("level")))
    return (levels.filter((F.col("level") == 1) | F.col("consumer").isNotNull())
            .select("destination", "metric", "count", F.col("q")[0].alias("p50"), F.col("q")[1].alias("p95"),
                    F.col("q")[2].alias("p99"), "consumer"))


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


def groups(events: DataFrame, grouped: DataFrame | None = None) -> DataFrame:
    """(destination, group, messages, assignments, owner_changes, owner): per message group, the messages
    enqueued, how often it was assigned and to a different consumer than before, and its owner at the end
    of the range (null when freed: closed, evicted, reset, or its owner was removed). `grouped`:
    group_messages(events) when the caller has it (then `events` may be just the control events)."""
    messages = group_messages(events) if grouped is None else grouped
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


def decode_consumers(frame: DataFrame, names: DataFrame) -> DataFrame:
    """`frame` with its `consumer` key replaced by the consumer's name (consumer_names; null stays null)."""
    joined = frame.alias("f").join(F.broadcast(names).alias("n"),
                                   (F.col("f.destination") == F.col("n.destination"))
                                   & (F.col("f.consumer") == F.col("n.key")), "left")
    return joined.select(*(F.col("n.name").alias("consumer") if c == "consumer" else F.col(f"f.`{c}`")
                           for c in frame.columns))


# The per-message tables all end in small aggregates, so the per-message rows become "facts" aggregated
# in one pass (no cached per-message table): kind LATENCY (consumer key, metric, value = ms), REDELIVERY
# (value = a life's max redeliveries), GROUP (consumer key, value = group key, first = 1 on the message's
# first group, so sum(first) counts messages), COMPLEX (msg: a message for complex_messages).
LATENCY_FACT, REDELIVERY_FACT, GROUP_FACT, COMPLEX_FACT = 0, 1, 2, 3
FACT_KEYS = ("destination", "kind", "consumer", "metric", "value", "msg", "sub")


def _fact(kind: int, *, consumer: Column | None = None, metric: str | None = None,
          value: Column | None = None, msg: Column | None = None, sub: Column | None = None,
          first: Column | int = 0) -> Column:
    def typed(column: Column | None, sql_type: str) -> Column:
        return (F.lit(None) if column is None else column).cast(sql_type)

    return F.struct(F.lit(kind).cast("tinyint").alias("kind"), typed(consumer, "bigint").alias("consumer"),
                    typed(None if metric is None else F.lit(metric), "string").alias("metric"),
                    typed(value, "bigint").alias("value"), typed(msg, "string").alias("msg"),
                    typed(sub, "string").alias("sub"),
                    typed(F.lit(first) if isinstance(first, int) else first, "int").alias("first"))


def _life_facts(sent_ts: Column, fd_ts: Column, fd_consumer: Column, ack_ts: Column, ack_consumer: Column,
                delivered_ts: Column, max_redeliveries: Column) -> list[Column]:
    """A life's latency samples (as latency_samples) and its redelivery count (as redelivery_distribution)."""
    return [
        F.when(fd_ts.isNotNull(), _fact(LATENCY_FACT, consumer=fd_consumer, metric="send_to_dispatch",
                                        value=fd_ts - sent_ts)),
        F.when(ack_ts.isNotNull() & delivered_ts.isNotNull(),
               _fact(LATENCY_FACT, consumer=ack_consumer, metric="dispatch_to_ack",
                     value=ack_ts - delivered_ts)),
        F.when(ack_ts.isNotNull(), _fact(LATENCY_FACT, consumer=ack_consumer, metric="send_to_ack",
                                         value=ack_ts - sent_ts)),
        F.when(max_redeliveries.isNotNull(), _fact(REDELIVERY_FACT, value=max_redeliveries)),
    ]


def _aggregate_facts(destination_and_facts: DataFrame) -> DataFrame:
    present = F.filter("facts", lambda f: f.isNotNull())
    return (destination_and_facts.select("destination", F.explode(present).alias("f"))
            .select("destination", "f.*")
            .groupBy(*FACT_KEYS).agg(F.count("*").alias("n"), F.sum("first").cast("long").alias("firsts")))


def message_facts(per_message: DataFrame) -> DataFrame:
    """The aggregated facts of the simple messages (their single life and their group: one group, dispatched
    to d_min and d_max) and a COMPLEX fact per other message."""
    simple = F.col("simple")
    grouped = simple & F.col("group_key").isNotNull() & (F.col("dispatches") > 0)
    facts = [F.when(simple, fact) for fact in _life_facts(
        F.col("sent_ts"), F.col("fd_ts"), F.col("fd_consumer"), F.col("ack_ts"), F.col("ack_consumer"),
        F.col("ld_ts"), F.col("max_redeliveries"))]
    facts += [
        F.when(grouped, _fact(GROUP_FACT, consumer=F.col("d_min"), value=F.col("group_key"), first=1)),
        F.when(grouped & (F.col("d_max") != F.col("d_min")),
               _fact(GROUP_FACT, consumer=F.col("d_max"), value=F.col("group_key"), first=1)),
        F.when(~simple, _fact(COMPLEX_FACT, msg=F.col("msg"), sub=F.col("sub"))),
    ]
    return _aggregate_facts(per_message.select("destination", F.array(*facts).alias("facts")))


def folded_facts(folded: DataFrame, salt: int) -> DataFrame:
    """The aggregated facts of complex_messages' lives and groups (names turned into keys)."""
    life = F.col("l")
    lives_facts = folded.select("destination", F.explode("lives").alias("l")).select(
        "destination", F.array(*_life_facts(
            life["sent_ts"], life["fd_ts"], key(life["fd_consumer"], salt), life["ack_ts"],
            key(life["ack_consumer"], salt), life["ack_delivered"], life["maxr"])).alias("facts"))
    group_facts = (folded.filter(F.size("groups") > 0)
                   .select("destination", F.explode("dispatched_to.consumer").alias("consumer"), "groups")
                   .select("destination", "consumer", F.posexplode("groups").alias("pos", "group"))
                   .select("destination", F.array(_fact(
                       GROUP_FACT, consumer=key("consumer", salt), value=key("group", salt),
                       first=F.when(F.col("pos") == 0, 1).otherwise(0))).alias("facts")))
    return _aggregate_facts(lives_facts.unionByName(group_facts))


def all_facts(events: DataFrame, fast: DataFrame, salt: int) -> DataFrame:
    """`fast` (message_facts, small: the pipeline caches it) with its COMPLEX facts replaced by those
    messages' folded facts."""
    keys = fast.filter(F.col("kind") == COMPLEX_FACT).select(*COPY)
    return (fast.filter(F.col("kind") != COMPLEX_FACT)
            .unionByName(folded_facts(complex_messages(events, keys), salt)))


def latency_from_facts(facts: DataFrame, names: DataFrame) -> DataFrame:
    """latency()'s table from the facts (histogram = the LATENCY facts)."""
    histogram = (facts.filter(F.col("kind") == LATENCY_FACT)
                 .groupBy("destination", "consumer", "metric", F.col("value").alias("value_ms"))
                 .agg(F.sum("n").alias("n")))
    return _percentiles(decode_consumers(histogram, names))


def redeliveries_from_facts(facts: DataFrame) -> DataFrame:
    """redelivery_distribution()'s table from the facts."""
    return (facts.filter(F.col("kind") == REDELIVERY_FACT)
            .groupBy("destination", F.col("value").alias("redeliveries")).agg(F.sum("n").alias("messages")))


def group_consumers_from_facts(facts: DataFrame, names: DataFrame) -> DataFrame:
    """group_consumers()'s table from the facts: a consumer's distinct group keys and its messages."""
    per_group = (facts.filter(F.col("kind") == GROUP_FACT).groupBy("destination", "consumer", "value")
                 .agg(F.sum("firsts").alias("messages")))
    keyed = per_group.groupBy("destination", "consumer").agg(
        F.count("*").alias("groups"), F.sum("messages").cast("long").alias("messages"))
    return decode_consumers(keyed, names)


def group_consumers(events: DataFrame) -> DataFrame:
    """(destination, consumer, groups, messages): per consumer, the distinct groups and grouped messages
    dispatched to it. Built as the pipeline builds it (messages, message_facts, all_facts)."""
    seen = consumers_seen(events)
    salt = key_salt(seen, group_messages(events))
    facts = all_facts(events, message_facts(messages(events, salt)), salt)
    return group_consumers_from_facts(facts, consumer_names(seen, salt))


def active_consumers(events: DataFrame, seen: DataFrame | None = None) -> DataFrame:
    """(destination, consumer): consumers seen in the range whose last add/remove was not a removal.
    `seen`: consumers_seen(events) when the caller has it."""
    frame = consumers_seen(events) if seen is None else seen
    return (frame.filter(F.col("removed_at").isNull() | (F.col("added_at") > F.col("removed_at")))
            .select("destination", "consumer"))


# The event types of the tables that read neither the per-message aggregates nor every event (groups'
# assignments and frees, dead letters, slow consumers, aborts): a small share of the events.
CONTROL_TYPES = ("deadletter", "discard", "group_assign", "group_close", "group_evict", "group_reset",
                 "consumer_remove", "slow", "slow_consumer", "abort")


def control_events(events: DataFrame) -> DataFrame:
    return events.filter(_type(*CONTROL_TYPES))


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
