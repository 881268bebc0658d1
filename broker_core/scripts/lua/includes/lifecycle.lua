-- How messages leave a destination or go back to it. Each path counts and logs what happened.
-- (virtual: a repeating scheduled message's firing is routed like a send, fire_scheduled)
--@include virtual
--@include cron

-- Redis runs a script's whole body on every call, and each `local function` costs a closure (and a walk
-- of the open upvalues for each name it uses). The paths most calls never take (expiry, scheduling,
-- returns, closing a consumer) are therefore built on first use: these fields of the module table
-- `lifecycle` start as stubs (at the end of this file) that build them all (lifecycle.load), then call the
-- real function.
local lifecycle = { parked = false }

-- Consumers closed while holding more messages than one call returns (close_consumer with a chunk): hash
-- consumer id -> the reason it closed. Each is gone from dispatch; its window (K_CINF), counters (K_C: 'n',
-- 'rcv') and outbox stay until return_owed has returned every message it holds. While any is owed, meta
-- 'fence' keeps the dispatch pass below that score (dispatch.lua): a message that was never returned
-- cannot overtake the owed ones, which the one-step close would have put ahead of it.
function lifecycle.closing_key() return base.P .. ':closing' end
-- Of those, the ones whose window still holds messages (a set: return_owed adds those it finds holding
-- some, returns_begin's first among them, and takes away those it finds empty): the fence lifts when it is
-- empty, without reading every closed consumer.
function lifecycle.closing_held_key() return base.P .. ':closing:held' end
-- Closed consumers a return_owed call looks at (any of them: each call returns its chunk from some): the
-- number closed at once has no limit (a gateway's connections dropped together).
lifecycle.CLOSING_LOOKS = 100
-- How long the maintenance index waits before a tick finishes returns a closer left owed (it drives them
-- itself, call after call; the tick is for a closer that died).
lifecycle.RETURNS_GRACE_MS = 2000

-- A topic message's references (<topic>:refs): each subscription holding it counts 1, a durable one
-- DURABLE_REF, so the count also answers "does a durable subscription hold it?" (>= DURABLE_REF) with no
-- command of its own: a new retroactive durable subscription's catch-up asks it of every stored message
-- (topic.lua catch_up). (A topic's non-durable subscriptions, each with its consumer, stay far below 2^32;
-- its durable ones below 2^31, where the count would leave Redis's 64-bit integers.)
lifecycle.DURABLE_REF = 4294967296
-- The ended subscriptions' keys (<topic>:ended) one release_ended call with a limit looks at: the set may
-- hold thousands (10,000 offline durable subscriptions expiring at once, each with its pending set), and
-- reading each one's ZCARD in every call took 35 ms a call (docs/benchmarks.md, session 30).
lifecycle.ENDED_LOOKS = 100
-- The weight of subscription `key`'s reference: its key's first character tells a durable one's, 'd'
-- (100) topics.py durable_key's, from a non-durable one's, 'c' non_durable_key's.
function lifecycle.ref_weight(key)
  return string.byte(key) == 100 and lifecycle.DURABLE_REF or 1
end

-- A subscription is done with topic message `id`: its reference (`weight`, ref_weight) let go, and the
-- message gone with the last.
-- A count stored before references were weighted (session 28 and earlier: every holder 1) is the only one
-- a durable subscription's release takes below 0 (a weighted count holds DURABLE_REF for each durable
-- holder): that release lets go of 1 instead, so such a message still goes with its last holder.
function lifecycle.release_shared(id, weight)
  local left = redis.call('HINCRBY', base.TP .. ':refs', id, -weight)
  if left < 0 then left = redis.call('HINCRBY', base.TP .. ':refs', id, weight - 1) end
  if left <= 0 then
    local own_meta = base.K_META
    base.K_META = base.TP .. ':meta'
    flow.memory_release(redis.call('HSTRLEN', base.TP .. ':msgs', id))
    base.K_META = own_meta
    redis.call('HDEL', base.TP .. ':msgs', id)
    redis.call('HDEL', base.TP .. ':refs', id)
    redis.call('ZREM', base.TP .. ':order', id)
  end
end

-- Messages a transaction acknowledged individually (ack.lua, a transacted ack's mode 'tx:<tx key>'; a
-- queue's, and a durable subscription's: ops/transactions.py ack): hash message id -> the transaction's
-- key while the message is in flight with its consumer; once that consumer closed with the transaction
-- still open, '<tx key>|<pending score>': the message is held for the transaction (return_messages), in
-- neither the pending zset nor a window, as ActiveMQ's Queue keeps a transacted ack's message (acked,
-- never dispatched again) after its subscription is removed, and its durable subscription's store holds
-- the ack in the transaction, applied at the commit whether the subscriber is there or not. The
-- commit consumes it (consume_held), a rollback returns it (return_held), and so does the maintenance
-- tick once the transaction's key is gone (return_lapsed: its owner died). TXHELD lists the held ones
-- by when their transaction is next looked at (its key's expiry, read when it was held or last looked at).
function lifecycle.txacks_key() return base.P .. ':txacks' end
function lifecycle.txheld_key() return base.P .. ':txheld' end
-- How long before the tick looks again at a held message whose transaction's key has no expiry.
lifecycle.TXHELD_RECHECK_MS = 60000

-- The message ids of `ids` held for the transaction whose key is `tx` (one HMGET).
function lifecycle.held_for(tx, ids)
  local out = {}
  if #ids == 0 then return out end
  local marks = base.call_many('HMGET', lifecycle.txacks_key(), ids)
  local head = tx .. '|'
  for i = 1, #ids do
    local mark = marks[i]
    if mark and string.sub(mark, 1, #head) == head then out[#out + 1] = ids[i] end
  end
  return out
end

-- Forget the stored state of messages that have left the destination: one command per key for all of
-- them, and one memory release.
-- a topic's message is stored once for all its subscriptions, with a reference count in
-- <topic>:refs; it is deleted (and its memory released, on the topic's meta) when the last
-- subscription is done with it.
-- With `charge_only` (a queue's messages), the memory is not released here: the bytes are returned for
-- the caller to write with its own counters (ack_messages). `marked` false: the caller knows no message
-- of this destination was ever marked by a transaction (meta 'txmarks', count_acked), so no mark is
-- looked for (a command less per ack).
function lifecycle.drop_messages(ids, charge_only, marked)
  local bytes = 0
  local fresh, sub, K_MSGS, charge = message.fresh, base.SUB, base.K_MSGS, flow.message_charge  -- (read once)
  local weight = sub and lifecycle.ref_weight(sub)
  for i = 1, #ids do
    local id = ids[i]
    fresh[id] = nil
    if sub then
      lifecycle.release_shared(id, weight)
    else
      local size = redis.call('HSTRLEN', K_MSGS, id)  -- 0 when it is not stored
      if size > 0 then bytes = bytes + charge(size) end
    end
  end
  if not base.SUB then
    if bytes > 0 and not charge_only then flow.memory_add(-bytes) end  -- flow.lua
    base.call_many('HDEL', base.K_MSGS, ids)
  end
  base.call_many('HDEL', base.K_REDELIV, ids)
  base.call_many('SREM', base.K_GFIRST, ids)
  if marked ~= false then base.call_many('HDEL', lifecycle.txacks_key(), ids) end  -- (txacks_key)
  return bytes
end
function lifecycle.drop_message(id) lifecycle.drop_messages({ id }) end

-- Take message `id` out of consumer `cid`'s window; returns its pending score (not read when
-- `no_score`: an acknowledged message never goes back).
function lifecycle.take_inflight(cid, id, no_score)
  local v = not no_score and redis.call('HGET', base.K_INFLIGHT, id)
  redis.call('HDEL', base.K_INFLIGHT, id)
  redis.call('ZREM', base.K_CINF(cid), id)
  redis.call('HINCRBY', base.K_C(cid), 'n', '-1')
  if no_score then return 0 end
  return tonumber(string.match(v or '', '|(.*)$')) or 0
end

-- Consumers acknowledged messages: `acks` holds, per consumer, {c, ids} (each id in flight with that
-- consumer, none twice: the caller checked). They are gone for good: one command per key for all of them
-- (the destination's keys once, each consumer's own once), and the counters written once.
-- `c.kept` (ack.lua): c.n is what the consumer's 'n' holds, kept so by every change this script makes
-- (the acks here, the dispatch chunk's deliveries: consumers.lua load_consumers), so the count is written
-- with the other counters; otherwise (receive.lua, whose dispatch chunk counted deliveries in a copy of
-- the consumer) it is decremented in Redis.
function lifecycle.ack_messages(acks)
  local all = acks[1][2]
  if #acks > 1 then
    all = {}
    for a = 1, #acks do
      local ids = acks[a][2]
      for i = 1, #ids do all[#all + 1] = ids[i] end
    end
  end
  if #all == 0 then return end
  base.call_many('HDEL', base.K_INFLIGHT, all)
  lifecycle.count_acked(all)
  for a = 1, #acks do
    local c, ids = acks[a][1], acks[a][2]
    local n = #ids
    if n > 0 then
      base.call_many('ZREM', base.K_CINF(c.id), ids)
      -- (made at its size: last_ack, acked, n, ext)
      local fields = { 'last_ack', base.NOW_TEXT.get(), nil, nil, nil, nil, nil, nil }
      if c.acked then  -- read by find_consumer and kept current here
        c.acked = c.acked + n
        fields[#fields + 1], fields[#fields + 2] = 'acked', base.NOW_TEXT.num(c.acked)
      else
        redis.call('HINCRBY', base.K_C(c.id), 'acked', base.NOW_TEXT.num(n))
      end
      if c.kept then
        fields[#fields + 1], fields[#fields + 2] = 'n', base.NOW_TEXT.num(c.n - n)
      else
        redis.call('HINCRBY', base.K_C(c.id), 'n', base.NOW_TEXT.num(-n))
      end
      c.n = c.n - n
      -- STANDARD/INDIVIDUAL acks contract the DELIVERED-ack extension, by one per message, never below zero.
      if c.prefetch > 0 and c.ext > 0 then
        c.ext = c.ext > n and c.ext - n or 0
        fields[#fields + 1], fields[#fields + 2] = 'ext', base.NOW_TEXT.num(c.ext)
      end
      redis.call('HSET', base.K_C(c.id), unpack(fields))
      local emit, cid = base.emit_message, c.id  -- (base.emit without its own call per message)
      for i = 1, n do emit(nil, 'ack', 'msg', ids[i], 'consumer', cid) end
    end
  end
end

-- Acknowledged messages `all` leave the destination: stored state dropped, counters written once.
function lifecycle.count_acked(all)
  local num = base.NOW_TEXT.num
  -- (dequeued counts purges and moves too; the rate history wants acks)
  if base.SUB then  -- (a topic's message is released on the topic's meta: lifecycle.release_shared)
    -- (a durable subscription's messages may be marked, txacks_key, and meta 'txmarks' says whether any
    -- ever was; a non-durable one's never are: its acks ask nothing, a command less. Its key's first
    -- character tells which: 'd' (100) topics.py durable_key's, 'c' non_durable_key's)
    lifecycle.drop_messages(all, nil, string.byte(base.SUB) == 100
                            and redis.call('HEXISTS', base.K_META, 'txmarks') == 1)
    base.meta_incr('dequeued', num(#all))
    base.meta_incr('acked', num(#all))
  else
    -- A queue's counters, the memory it holds among them, read with the memory floor in one command and
    -- written in one (where they were the floor's read and three increments: bench/redis_instructions.py)
    local meta = redis.call('HMGET', base.K_META, 'memmin', 'mem', 'dequeued', 'acked', 'txmarks')
    flow.floor_read(meta[1])
    local bytes = lifecycle.drop_messages(all, true, meta[5] and true or false)
    redis.call('HSET', base.K_META, 'mem', num((base.number(meta[2]) or 0) - bytes),
               'dequeued', num((base.number(meta[3]) or 0) + #all), 'acked', num((base.number(meta[4]) or 0) + #all))
    if bytes > 0 then flow.usage_add(-bytes) end
  end
end

-- Messages held for the transaction whose key is `tx` (held_for), acknowledged by its commit on behalf of
-- consumer `cid`, closed since: consumed as its ack would have, one 'ack' event each.
function lifecycle.consume_held(cid, ids)
  if #ids == 0 then return end
  base.call_many('ZREM', lifecycle.txheld_key(), ids)
  lifecycle.count_acked(ids)  -- (drop_messages forgets their marks)
  for i = 1, #ids do base.emit_message(nil, 'ack', 'msg', ids[i], 'consumer', cid) end
end

-- Whether the current prefix is a topic's own keys (keys.py Home.fans_out): they hold no messages of
-- their own (those are its subscriptions', in its shared store), only its scheduled jobs.
function lifecycle.fans_out()
  return not base.SUB and string.match(base.P, '^.-:{(%a):') == 't'
end

-- When the first parked message is due, as far as this script call knows (nil: ask Redis).
-- (topic_checked: fire_topic_jobs looked in this call)
lifecycle.parked = { next = nil, due_at = base.due_at, topic_checked = false }  -- (due_at through it: lifecycle.load is near Lua's 60 upvalues)
--@on-call
lifecycle.parked.next, lifecycle.parked.topic_checked = nil, false
--@on-call-end

-- The next time a parked message comes back (0 if none).
function lifecycle.next_unpark()
  if lifecycle.parked.next == nil then
    local first = redis.call('ZRANGE', base.K_PARKED, '0', '0', 'WITHSCORES')
    lifecycle.parked.next = #first == 0 and 0 or tonumber(first[2])
  end
  return lifecycle.parked.next
end

-- The meta's 'scheduled': how many parked entries are scheduled (a queue's delayed message, a job:
-- parkinfo 's<score>' or 'job', parked_score), the others waiting for a redelivery delay, so the stats
-- tell them apart without a walk (ops/homes.py parked_counts). Kept where an entry is written
-- (parked_info) and deleted (unparked, given the entry it had); it never goes below 0 (entries parked
-- before it was kept are not in it).
function lifecycle.parked_info(id, info, scheduled)
  if redis.call('HSET', base.K_PARKINFO, id, info) == 1 and scheduled then base.meta_incr('scheduled') end
end

function lifecycle.unparked(id, info)
  if redis.call('HDEL', base.K_PARKINFO, id) == 1 and info
     and (info == 'job' or string.byte(info) == 115)  -- (parked_score: 's' or a job)
     and (tonumber(redis.call('HGET', base.K_META, 'scheduled')) or 0) > 0 then
    base.meta_incr('scheduled', -1)
  end
end

-- Bring back parked messages whose time has come (bounded); returns how many.
function lifecycle.unpark_due(limit)
  local first = lifecycle.next_unpark()
  if first == 0 or first > base.NOW then return 0 end  -- the usual case costs one look at the head
  lifecycle.parked.next = nil
  local due = redis.call('ZRANGEBYSCORE', base.K_PARKED, '-inf', base.NOW, 'LIMIT', 0, limit, 'WITHSCORES')
  for i = 1, #due, 2 do
    local id, at = due[i], tonumber(due[i + 1])
    local info = redis.call('HGET', base.K_PARKINFO, id)
    if info == 'job' then
      lifecycle.fire_scheduled(id, at)
    else
      redis.call('ZREM', base.K_PARKED, id)
      lifecycle.unparked(id, info)
      if info and string.byte(info) == 115 then  -- 's': a delayed message (parked_score)
        lifecycle.scheduled_arrived(id, tonumber(string.sub(info, 2)))
      elseif info and redis.call('HEXISTS', base.K_MSGS, id) == 1 then
        message.pending_add(id, tonumber(info))
      end
    end
  end
  message.sizes_write(base.K_META)  -- (those that arrived: scheduled_arrived, deliver_job)
  return #due / 2
end

-- A topic's jobs that are due fire from any of its scripts' dispatch chunks (a subscription's, or the
-- topic's own: topic_send.lua), once per call: its subscribers then meet its scheduled messages on time, as
-- a queue's consumers meet the queue's own, not only at the maintenance tick. Each firing is a record the
-- caller publishes (flag 2: lifecycle.lua publish_firing). The usual case costs one look at the head.
function lifecycle.fire_topic_jobs(limit)
  if lifecycle.parked.topic_checked or not (base.SUB or lifecycle.fans_out()) then return end
  lifecycle.parked.topic_checked = true
  local first = redis.call('ZRANGE', base.TP .. ':parked', '0', '0', 'WITHSCORES')
  if #first == 0 or tonumber(first[2]) > base.NOW then return end
  local own = base.P
  base.use_prefix(base.TP)
  lifecycle.parked.next = nil
  lifecycle.unpark_due(limit)
  base.use_prefix(own)
  lifecycle.parked.next = nil
end

-- When a job sent now fires first (send.lua, topic_send.lua): after its delay; a cron job (AMQ_SCHEDULED_CRON)
-- at its expression's first time after now, plus its delay, or its period when it has no delay (ActiveMQ's
-- JobScheduler: its first time only; later ones are the expression's own). A form cron.py accepted always
-- has a next time (includes/cron.lua); nil otherwise.
function lifecycle.job_start(m)
  local delay = message.schedule_ms(m[message.DELAY])
  local form = message.cron(m)
  if not form then return base.NOW + delay end
  local first = cron.next(form, base.NOW)
  return first and first + (delay > 0 and delay or message.schedule_ms(m[message.PERIOD]))
end

-- A cron job with a repeat starts, at each of its times, a run of repeat + 1 deliveries a period apart
-- (ActiveMQ's scheduler schedules a new job then, and delivers nothing itself); its runs still going are kept
-- in the job, at most this many at once: a time that comes while as many are going starts none.
lifecycle.MAX_CRON_RUNS = 16
-- How long a job's firing into a destination over its memory limit waits before it is tried again.
lifecycle.FIRING_RETRY_MS = 1000

-- Built on first use (see the top of this file): expiry, scheduling, returns, closing.
function lifecycle.load()
  -- A message whose time ran out (spec §6): counted, logged, dead-lettered or dropped per strategy.
  -- `acked`: the expiry stands for the client's EXPIRED ack (outbox.hand_over); on a non-durable topic
  -- subscription (key 'c.<consumer>') ActiveMQ's TopicSubscription.acknowledge only counts that ack
  -- (ExpiredCount, dequeues): no dead letter, no Expired advisory (the event says `acked`).
  lifecycle.expire_message = function(id, m, blob, acked)
    lifecycle.drop_message(id)
    base.meta_incr('expired')
    base.meta_incr('dequeued')
    local expiration = tonumber(m[message.EXPIRATION]) or 0
    if acked and base.SUB and string.sub(base.SUB, 1, 2) == 'c.' then
      base.emit_message(false, 'expire', 'msg', id, 'expiration', expiration, 'acked', 1)
      return
    end
    -- the Expired advisory carries a copy (it is gone from K_MSGS)
    base.emit_message(blob, 'expire', 'msg', id, 'expiration', expiration)
    forward.dead_letter(id, m, blob, 'expired', expiration)
  end

  lifecycle.expire_pending = function(id, m, blob)
    redis.call('ZREM', base.K_PENDING, id)
    message.pass_dirty.pending = nil
    lifecycle.expire_message(id, m, blob)
  end

  -- A non-durable topic subscription's (key 'c.<consumer id>', topics.non_durable_key) pending message
  -- given up for good, as ActiveMQ 5.17.2's TopicSubscription.discard: by the eviction strategy (§8.5;
  -- `why` its name) or expired when the dispatch met it (dispatchMatched; `why` 'expired'). Counted as the
  -- subscription's DiscardedCount (`evicted`) and the topic's dequeues (not the subscription's: those
  -- are acks), the `evict` event (MessageDiscarded advisory), and dead-lettered with the cause naming the
  -- consumer (messages.failure_cause).
  lifecycle.discard_pending = function(id, blob, why)
    redis.call('ZREM', base.K_PENDING, id)
    message.pass_dirty.pending = nil
    base.meta_incr('evicted')
    redis.call('HINCRBY', base.TP .. ':meta', 'evict_dequeued', 1)
    base.emit('evict', 'msg', id, 'strategy', why)
    if blob then forward.dead_letter(id, message.unpack(blob), blob, 'evicted', string.sub(base.SUB, 3)) end
    lifecycle.drop_message(id)
  end

  -- A parked message's `…:parkinfo` entry: the pending score it comes back with; 's' before it for a
  -- delayed (scheduled) message, which is not on the queue until its time (ActiveMQ's SchedulerBroker
  -- keeps it in its job store and sends it to the queue when due, and the queue counts it then); 'job'
  -- for a repeating job. Returns the score (nil for a job) and whether it is scheduled (a job is too).
  lifecycle.parked_score = function(info)
    if info == 'job' then return nil, true end
    if string.byte(info) == 115 then return tonumber(string.sub(info, 2)), true end  -- 's'
    return tonumber(info), false
  end

  -- A delayed message's time came (unpark_due): it goes on the queue, counted, with the `enqueue` event
  -- and the NoConsumer check of its arrival, as a send's (send.lua), now and not when it was sent.
  lifecycle.scheduled_arrived = function(id, score)
    local kept = redis.call('HGET', base.K_MSGS, id)
    if not kept then return end
    message.pending_add(id, score)
    local blob, m = message.restamp(kept, message.unpack(kept))  -- its time to live from now on
    if blob ~= kept then
      redis.call('HSET', base.K_MSGS, id, blob)
      flow.memory_release(#kept)
      flow.memory_charge(#blob)
    end
    base.meta_incr('enqueued')
    message.size_note(flow.message_charge(#blob))
    base.emit_message(blob, 'enqueue', 'msg', id, 'priority', m[message.PRIORITY] or 4,
                      'group', m[message.GROUP] or '', 'size', #blob, 'scheduled', id)
    advisory.no_consumer(id, blob, m[message.PERSISTENT])
  end

  -- Hold a message out of dispatch until `at`; it comes back with pending score `score`. `scheduled`: a
  -- delayed message of a queue, which counts as enqueued when it comes back (parked_score).
  lifecycle.park = function(id, at, score, scheduled)
    redis.call('ZADD', base.K_PARKED, at, id)
    lifecycle.parked.due_at(base.P, at)
    lifecycle.parked_info(id, scheduled and 's' .. base.NOW_TEXT.num(score) or score, scheduled)
    lifecycle.parked.next = nil
  end

  -- A repeating scheduled message (AMQ_SCHEDULED_REPEAT) is a job kept under the message's id; each time
  -- it fires, one delivery '<id>#<n>' is enqueued, until the repeats are spent. ('#' is not allowed in
  -- producers' ids, so deliveries never meet another message's id.) A job sent with a routing plan
  -- (virtual destinations, includes/virtual.lua) keeps it: each firing is routed like a send of the
  -- delivery (ActiveMQ's scheduler re-sends every repeat to the destination), so its copies, a topic's
  -- too, are made then, selectors evaluated then; the targets are those of the send.
  -- A topic's own keys hold its jobs, delayed messages included (topic_send.lua): ActiveMQ's
  -- SchedulerBroker keeps those in its job store too and sends each firing to the topic when due, to the
  -- subscriptions of that time. A delayed message's one firing keeps its id (SchedulerBroker gives a new
  -- id only to a repeat's). `retain`, `retained`: a topic message's ActiveMQ.Retain action and retained
  -- copy (topics.pack_for_topic), applied when it is published.
  -- (period 0: one firing, a delayed message's; queues.parked_times lists such a job as no repeating one)
  -- A cron job (message.cron(m)) fires at each time its expression names, from `at` (lifecycle.job_start),
  -- until cancelled: the job also keeps its form, its next time and its runs going (fire_cron).
  lifecycle.schedule_job = function(id, blob, m, at, plan, retain, retained)
    local repeats = tonumber(m[message.REPEAT]) or 0
    local form = message.cron(m) or false
    redis.call('HSET', base.K_SCHED, id, cmsgpack.pack({ blob, repeats > 0 and tonumber(m[message.PERIOD]) or 0,
                                                          repeats, 0, plan or false, retain or '', retained or '',
                                                          form, form and at or false, form and {} or false }))
    flow.memory_charge(#blob)  -- the job holds the message until its last delivery (flow.lua)
    redis.call('ZADD', base.K_PARKED, at, id)
    lifecycle.parked.due_at(base.P, at)
    lifecycle.parked_info(id, 'job', true)
    lifecycle.parked.next = nil
  end

  -- A topic's firing is published like a send to the topic, by the outbox (ops/forward.py, kind
  -- 'scheduled': the copy loses its schedule, and the topic's routing, applied by the job's plan, is not
  -- applied again): one record here, so a call fires a bounded number of jobs whatever the subscriptions,
  -- whose fan-out topic_send.lua bounds. Until delivered it counts against the topic's memory as a
  -- virtual copy does ('memfwd', virtual.lua) and shows as `forwarding`.
  lifecycle.publish_firing = function(delivery, blob, retain, retained)
    local uri = 'topic://' .. string.match(base.P, '^.-:{t:(.*)}$')
    local charge = flow.message_charge(#blob)
    redis.call('HINCRBY', base.K_META, 'memfwd', charge)
    redis.call('HSET', base.K_FWD, delivery .. '|' .. uri,
               cmsgpack.pack({ uri, 'scheduled', retain, blob, base.meta_incr('fwdseq'), charge, retained }))
    base.due_at(base.TP, base.NOW)
    forward.n = forward.n + 1
  end

  -- One delivery of a job: '<id>#<n>' (a repeat's, a cron job's; n counts the job's deliveries) or the id (a
  -- delayed message's one firing on a topic), its time to live from now on. Returns the message's fields.
  lifecycle.deliver_job = function(id, job)
    local kept, plan = job[1], job[5] or nil
    local blob, m = message.restamp(kept, message.unpack(kept))  -- each firing's time to live from now on
    job[4] = job[4] + 1
    local delivery = (job[8] or (tonumber(m[message.REPEAT]) or 0) > 0) and id .. '#' .. job[4] or id
    -- the copies leave without the schedule (virtual.py forward_copy); nothing kept here when the
    -- plan forwards only (a forward-only composite)
    if virtual.route(delivery, blob, m, plan) then
      if lifecycle.fans_out() then
        lifecycle.publish_firing(delivery, blob, job[6] or '', job[7] or '')
      else
        local seq = base.meta_incr('seq')
        redis.call('HSET', base.K_MSGS, delivery, blob)
        flow.memory_charge(#blob)
        message.pending_add(delivery, message.pending_score(seq, m[message.PRIORITY]))
        base.meta_incr('enqueued')
        message.size_note(flow.message_charge(#blob))
        base.emit('enqueue', 'msg', delivery, 'priority', m[message.PRIORITY] or 4, 'group', m[message.GROUP] or '',
             'size', #blob, 'scheduled', id)
        -- each firing is a send (SchedulerBroker re-sends it, Queue.messageSent): the NoConsumer check
        -- runs for this delivery, under its own id (includes/advisory.lua)
        advisory.no_consumer(delivery, blob, m[message.PERSISTENT])
      end
    end
    return m
  end

  -- A cron job's turn (job[8] its form, job[9] its next time, job[10] its runs going: {next time, deliveries
  -- left} each): at most two deliveries per call (a repeat's is one). Its time come: without a repeat it
  -- delivers, with one it starts a run, whose first delivery is its delay, or its period, from now (ActiveMQ
  -- schedules a job then, with the cron job's delay, period and repeat), and the next time is the
  -- expression's first after now (none missed are made up). Then the run due first delivers, and is due a
  -- period later. Returns when the job is next due (nil: it has ended).
  lifecycle.fire_cron = function(id, job)
    local runs, period = job[10], tonumber(job[2]) or 0
    if job[9] and job[9] <= base.NOW then
      if (tonumber(job[3]) or 0) > 0 then
        if #runs < lifecycle.MAX_CRON_RUNS then
          local delay = message.schedule_ms(message.unpack(job[1])[message.DELAY])
          runs[#runs + 1] = { base.NOW + (delay > 0 and delay or period), job[3] + 1 }
        end
      else
        lifecycle.deliver_job(id, job)
      end
      job[9] = cron.next(job[8], base.NOW) or false
    end
    local first
    for k = 1, #runs do
      if not first or runs[k][1] < runs[first][1] then first = k end
    end
    if first and runs[first][1] <= base.NOW then
      lifecycle.deliver_job(id, job)
      runs[first][1], runs[first][2] = runs[first][1] + period, runs[first][2] - 1
      if runs[first][2] <= 0 then table.remove(runs, first) end
    end
    local next_at = job[9] or nil
    for k = 1, #runs do
      if not next_at or runs[k][1] < next_at then next_at = runs[k][1] end
    end
    return next_at
  end

  lifecycle.fire_scheduled = function(id, at)
    local job = cmsgpack.unpack(redis.call('HGET', base.K_SCHED, id))
    -- A firing waits while its destination, the broker or a routing target is over its memory limit
    -- (ActiveMQ's scheduler blocks in the send under producer flow control): it is tried again
    -- FIRING_RETRY_MS later, and a cron time passed meanwhile is not made up. Over, not merely full, so the
    -- job's own charge never stops it (need 0: a firing may take usage past the limit by one delivery).
    if flow.memory_refusal(0, job[5] or nil) then
      redis.call('ZADD', base.K_PARKED, base.NOW + lifecycle.FIRING_RETRY_MS, id)
      lifecycle.parked.due_at(base.P, base.NOW + lifecycle.FIRING_RETRY_MS)
      return
    end
    local next_at
    if job[8] then
      next_at = lifecycle.fire_cron(id, job)
    else
      lifecycle.deliver_job(id, job)
      if job[3] > 0 then job[3], next_at = job[3] - 1, at + job[2] end
    end
    if next_at then
      redis.call('HSET', base.K_SCHED, id, cmsgpack.pack(job))
      redis.call('ZADD', base.K_PARKED, next_at, id)
      lifecycle.parked.due_at(base.P, next_at)
    else
      redis.call('HDEL', base.K_SCHED, id)
      flow.memory_release(#job[1])
      redis.call('ZREM', base.K_PARKED, id)
      lifecycle.unparked(id, 'job')
    end
  end

  -- Closing a consumer or a subscription.
  lifecycle.recompute_exclusive_owner = function(removed_def, removed_id)
    local owner = redis.call('HGET', base.K_META, 'owner')
    local all_exclusive = base.policy_flag('allConsumersExclusiveByDefault')
    if owner == removed_id and removed_def.exclusive then
      -- The first exclusive consumer, in list order, with the highest priority takes over.
      local best, best_priority = nil, nil
      for _, c in ipairs(consumers.load()) do
        if c.def.exclusive and (best_priority == nil or c.priority > best_priority) then
          best, best_priority = c.id, c.priority
        end
      end
      redis.call('HSET', base.K_META, 'owner', best or '')
    elseif all_exclusive then
      local best, best_priority = nil, nil
      for _, c in ipairs(consumers.load()) do
        if best_priority == nil or c.priority > best_priority then best, best_priority = c.id, c.priority end
      end
      redis.call('HSET', base.K_META, 'owner', best or '')
    elseif owner == removed_id then
      redis.call('HSET', base.K_META, 'owner', '')
    end
    local now_owner = redis.call('HGET', base.K_META, 'owner')
    if now_owner ~= owner and now_owner ~= '' then base.emit('exclusive_owner', 'consumer', now_owner) end
  end

  -- the end of a subscription (docs/broker_core.md "Topics"). Every message it holds (pending,
  -- parked, in flight) is counted on the topic as 'sub_removed' now, and released from the shared store in
  -- the calls that follow: the keys listing them (in flight: each message is in one consumer's window, a
  -- closed consumer's too) are renamed aside, <topic>:ended:<n>:<i> (<n>:d<i> for a durable subscription's:
  -- its references weigh DURABLE_REF), listed in the set <topic>:ended, and return_owed (closing_load)
  -- releases them a chunk per call. The rest of its keys go now (UNLINK: a big one is freed outside the
  -- call).
  lifecycle.remove_subscription = function(reason)
    local dropped = 0
    -- (txheld_key: a durable subscription's messages held for open transactions, whose commits then skip
    -- their acks: ops/transactions.py commit)
    local holders = { base.K_PENDING, base.K_PARKED, lifecycle.txheld_key() }
    for _, cid in ipairs(redis.call('HKEYS', base.K_CONSUMERS)) do holders[#holders + 1] = base.K_CINF(cid) end
    for _, cid in ipairs(redis.call('HKEYS', base.P .. ':closing')) do holders[#holders + 1] = base.K_CINF(cid) end
    local aside = nil
    for i = 1, #holders do
      local n = redis.call('ZCARD', holders[i])
      if n > 0 then
        aside = aside or base.TP .. ':ended:' .. redis.call('HINCRBY', base.TP .. ':meta', 'endseq', 1) .. ':'
                         .. (lifecycle.ref_weight(base.SUB) == 1 and '' or 'd')
        redis.call('RENAME', holders[i], aside .. i)
        redis.call('SADD', base.TP .. ':ended', aside .. i)
        base.due_at(base.TP, base.NOW + lifecycle.RETURNS_GRACE_MS)  -- the tick releases them if the caller dies
        dropped = dropped + n
      end
    end
    -- the topic's counts never go down (§14.2): what the subscription counted stays on the topic.
    local ENDED = { 'dequeued', 'dispatched', 'expired', 'deadlettered', 'discarded', 'evicted', 'dropped',
                    'acked', 'redelivered' }
    local counts = redis.call('HMGET', base.K_META, unpack(ENDED))
    for i, name in ipairs(ENDED) do
      local n = tonumber(counts[i]) or 0
      if n ~= 0 then redis.call('HINCRBY', base.TP .. ':meta', 'ended_' .. name, n) end
    end
    local keys = { base.K_META, base.K_PENDING, base.K_INFLIGHT, base.K_REDELIV, base.K_GFIRST, base.K_CONSUMERS, base.K_CORDER, base.K_LEASES,
      base.K_PASSFULL, base.K_GROUPS, base.K_GLRU, base.K_PARKED, base.K_PARKINFO, base.K_SCHED, base.K_AUDIT,
      base.P .. ':maint', base.P .. ':slowcons', lifecycle.txacks_key(), lifecycle.txheld_key() }
    for _, cid in ipairs(redis.call('HKEYS', base.K_CONSUMERS)) do
      redis.call('HDEL', base.TP .. ':subof', cid)
      keys[#keys + 1] = base.K_C(cid)
      keys[#keys + 1] = base.K_CINF(cid)
      keys[#keys + 1] = base.K_COUT(cid)
      keys[#keys + 1] = base.K_CGRP(cid)
    end
    -- (closed consumers whose returns were owed: their windows were set aside above)
    for _, cid in ipairs(redis.call('HKEYS', base.P .. ':closing')) do
      keys[#keys + 1] = base.K_C(cid)
      keys[#keys + 1] = base.K_CINF(cid)
      keys[#keys + 1] = base.K_COUT(cid)
    end
    keys[#keys + 1] = base.P .. ':closing'
    keys[#keys + 1] = lifecycle.closing_held_key()
    redis.call('UNLINK', unpack(keys))
    message.pass_dirty.passfull_key, message.pass_dirty.pending = nil, nil
    redis.call('HDEL', base.TP .. ':subs', base.SUB)
    -- (count 1: a key is listed once, topic_subscribe.lua; the scan stops there, so a topic's deletion,
    -- which removes from the head, does not walk the whole list per subscription)
    redis.call('LREM', base.TP .. ':sorder', 1, base.SUB)
    redis.call('LREM', base.TP .. ':sprio', 1, base.SUB)  -- (the priority policy's order, topic.lua)
    -- (a build of it under way, topic.lua index_ready: a key walked already leaves the walk's count)
    if redis.call('ZREM', base.TP .. ':sprio:build', base.SUB) == 1 then
      if redis.call('HEXISTS', base.TP .. ':meta', 'sprio_walk') == 1 then
        redis.call('HINCRBY', base.TP .. ':meta', 'sprio_walk', -1)
      end
    end
    -- a wildcard pattern with no subscription left leaves <ns>:wildcards in this step (wildcard.lua)
    if redis.call('HLEN', base.TP .. ':subs') == 0 then wildcard.mark(false) end
    if dropped > 0 then redis.call('HINCRBY', base.TP .. ':meta', 'sub_removed', dropped) end
    base.emit('subscription_remove', 'reason', reason, 'dropped', dropped)
    return dropped
  end

  -- a subscription's consumer went away (closed, lease lapsed, aborted). A non-durable
  -- subscription ends with it (its messages are dropped, as a TopicSubscription's are); a durable one goes
  -- offline and keeps receiving, its unacknowledged messages back in its pending list.
  lifecycle.subscription_consumer_gone = function(cid, reason)
    redis.call('HDEL', base.TP .. ':subof', cid)
    if redis.call('HGET', base.K_META, 'durable') == '1' then
      redis.call('HSET', base.K_META, 'active', '', 'offline_since', base.NOW)
      base.emit('subscription_offline', 'consumer', cid, 'reason', reason)
    else
      lifecycle.remove_subscription(reason)
    end
  end
end

-- Built on first use too, apart from lifecycle.load (a Lua function has at most 60 upvalues): closing a
-- consumer, and returning what it holds in chunks.
function lifecycle.load_closing()
  -- Put in-flight messages of consumer `cid` back in the pending zset ahead of fresh messages (closing,
  -- rollback), one command per key for all of them: `held` is id, dispatch sequence, ... (as ZRANGE of its
  -- window WITHSCORES gives them). Those at or below `rcv` (the adapter had received them: they reached
  -- the client) get the redelivery counter raised, as Queue.removeSubscription does. Returns how many.
  lifecycle.return_messages = function(cid, held, rcv, reason)
    local n = #held / 2
    if n == 0 then return 0 end
    local ids = {}
    for i = 1, #held, 2 do ids[#ids + 1] = held[i] end
    local where = base.call_many('HMGET', base.K_INFLIGHT, ids)
    local counts = base.call_many('HMGET', base.K_REDELIV, ids)
    -- a message an open transaction acknowledged is held for it (lifecycle.txacks_key), not returned (a
    -- rollback returns it): a closing queue consumer's, or a durable subscription's (a non-durable one's
    -- messages are never marked: they end with it)
    local marks = base.call_many('HMGET', lifecycle.txacks_key(), ids)
    local entries, bumped, lowest, hold, unmark, returned = {}, {}, nil, {}, {}, {}
    for k = 1, n do
      local id = ids[k]
      local score = message.redelivery_score(tonumber(string.match(where[k] or '', '|(.*)$')) or 0)
      local count = tonumber(counts[k]) or 0
      if tonumber(held[2 * k]) <= rcv then
        count = count + 1
        local at = #bumped
        bumped[at + 1], bumped[at + 2] = id, string.format('%d', count)
      end
      counts[k] = count
      local mark = marks[k]
      local ttl = mark and reason ~= 'rollback' and redis.call('PTTL', mark)
      if ttl and ttl ~= -2 then
        hold[#hold + 1] = { id, mark .. '|' .. base.NOW_TEXT.num(score), ttl, k }
      else
        if mark then unmark[#unmark + 1] = id end
        if lowest == nil or score < lowest then lowest = score end
        local at = #entries
        entries[at + 1], entries[at + 2] = base.NOW_TEXT.num(score), id
        returned[#returned + 1] = k
      end
    end
    base.call_many('HDEL', base.K_INFLIGHT, ids)
    base.call_many('ZREM', base.K_CINF(cid), ids)
    redis.call('HINCRBY', base.K_C(cid), 'n', string.format('%d', -n))
    base.call_many('HSET', base.K_REDELIV, bumped)
    if #bumped > 0 then base.meta_incr('redelivered', string.format('%d', #bumped / 2)) end
    base.call_many('HDEL', lifecycle.txacks_key(), unmark)
    if #entries > 0 then message.pending_add_many(entries, lowest) end
    for i = 1, #returned do
      local k = returned[i]
      base.emit('return', 'msg', ids[k], 'consumer', cid, 'redeliveries', counts[k], 'reason', reason)
    end
    for i = 1, #hold do
      local id, value, ttl = hold[i][1], hold[i][2], hold[i][3]
      local at = base.NOW + (ttl >= 0 and ttl or lifecycle.TXHELD_RECHECK_MS)
      redis.call('HSET', lifecycle.txacks_key(), id, value)
      redis.call('ZADD', lifecycle.txheld_key(), string.format('%d', at), id)
      base.due_at(base.P, at)  -- the tick returns it if the transaction lapses (its owner died)
      base.emit('hold', 'msg', id, 'consumer', cid, 'redeliveries', counts[hold[i][4]],
                'transaction', string.match(value, ':tx:(tx%-%x+)|') or value)
    end
    return n
  end

  -- Held messages `ids` (held_for) go back to the pending zset where their consumer's close would have
  -- put them (their redelivery counter was raised then), one 'return' event each with `reason`.
  lifecycle.return_held = function(ids, reason)
    if #ids == 0 then return 0 end
    local marks = base.call_many('HMGET', lifecycle.txacks_key(), ids)
    local counts = base.call_many('HMGET', base.K_REDELIV, ids)
    local entries, lowest = {}, nil
    for i = 1, #ids do
      local score = tonumber(string.match(marks[i] or '', '|([^|]*)$')) or 0
      if lowest == nil or score < lowest then lowest = score end
      entries[2 * i - 1], entries[2 * i] = base.NOW_TEXT.num(score), ids[i]
    end
    base.call_many('HDEL', lifecycle.txacks_key(), ids)
    base.call_many('ZREM', lifecycle.txheld_key(), ids)
    message.pending_add_many(entries, lowest)
    for i = 1, #ids do
      base.emit('return', 'msg', ids[i], 'redeliveries', tonumber(counts[i]) or 0, 'reason', reason)
    end
    return #ids
  end

  -- Up to `limit` held messages whose transaction was due to be looked at: returned when its key is gone
  -- (it lapsed: its owner died; or it ended and a step failed to say so), else looked at again when the
  -- key would expire now. Returns how many it returned, and how many are still due.
  lifecycle.return_lapsed = function(limit)
    local key = lifecycle.txheld_key()
    local now = base.NOW_TEXT.num(base.NOW)
    local due = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, limit or -1)
    if #due == 0 then return 0, 0 end
    local marks = base.call_many('HMGET', lifecycle.txacks_key(), due)
    local gone = {}
    for i = 1, #due do
      local tx = string.match(marks[i] or '', '^(.*)|[^|]*$')
      local ttl = tx and redis.call('PTTL', tx) or -2
      if not tx then  -- (no longer held: an operator took it out)
        redis.call('ZREM', key, due[i])
      elseif ttl == -2 then
        gone[#gone + 1] = due[i]
      else
        local at = base.NOW + (ttl >= 0 and ttl or lifecycle.TXHELD_RECHECK_MS)
        redis.call('ZADD', key, string.format('%d', at), due[i])
        base.due_at(base.P, at)
      end
    end
    local returned = lifecycle.return_held(gone, 'transaction ended')
    return returned, redis.call('ZCOUNT', key, '-inf', now)
  end

  -- A closed consumer's returns are all made: forget it; with none left owed the fence goes and the pass
  -- starts over at the head (the fence may have held it back).
  local function returns_done(cid)
    redis.call('DEL', base.K_C(cid), base.K_CINF(cid), base.K_COUT(cid), base.K_CGRP(cid))
    redis.call('HDEL', lifecycle.closing_key(), cid)
    redis.call('SREM', lifecycle.closing_held_key(), cid)
  end

  -- With no closed consumer holding messages any more the fence goes and the pass starts over at the head
  -- (the fence may have held it back). Groups still being freed need no fence: dispatch treats them as
  -- free already.
  local function lift_fence()
    if redis.call('HEXISTS', base.K_META, 'fence') == 0 then return end
    -- (a new retroactive durable subscription's catch-up holds it too: topic.lua catch_up lifts it)
    if redis.call('HEXISTS', base.K_META, 'catchup') == 1 then return end
    local held = lifecycle.closing_held_key()
    for _, cid in ipairs(redis.call('SRANDMEMBER', held, lifecycle.CLOSING_LOOKS)) do
      if redis.call('ZCARD', base.K_CINF(cid)) > 0 then return end
      redis.call('SREM', held, cid)  -- (emptied by other means: its messages purged, or acknowledged)
    end
    if redis.call('SCARD', held) > 0 then return end
    redis.call('HDEL', base.K_META, 'fence')
    message.reset_pass()
  end

  -- Group entries of closed consumers deleted per call: a `simple` map's consumer may own any number.
  local GROUP_FREE_CHUNK = 1000

  -- Delete up to `n` of the group entries closed consumer `cid` still has (those another consumer took
  -- over meanwhile were moved out of its set by group_assign). Returns how many are left.
  local function free_groups(cid, n)
    local key = base.K_CGRP(cid)
    if n > 0 then
      local slots = redis.call('SPOP', key, n)
      if #slots > 0 then
        local owners = base.call_many('HMGET', base.K_GROUPS, slots)
        local mine = {}
        for i = 1, #slots do
          if owners[i] and groups.owner_of(owners[i]) == cid then mine[#mine + 1] = slots[i] end
        end
        base.call_many('HDEL', base.K_GROUPS, mine)
        if groups.map_type() == 'cached' then base.call_many('ZREM', base.K_GLRU, mine) end
      end
    end
    return redis.call('SCARD', key)
  end

  -- Release up to `limit` (all when nil) of the messages ended subscriptions of this topic held
  -- (remove_subscription set them aside), from at most ENDED_LOOKS of their keys when `limit` is given (any
  -- of them: each call empties some or releases `limit`). Returns how many, and how many are left (0:
  -- none; counted over the keys it looked at, plus one for each key it did not look at).
  lifecycle.release_ended = function(limit)
    local ended = base.TP .. ':ended'
    local released, left, kept = 0, 0, 0
    local keys = limit and redis.call('SRANDMEMBER', ended, lifecycle.ENDED_LOOKS) or redis.call('SMEMBERS', ended)
    for _, key in ipairs(keys) do
      local take = limit and limit - released or -1
      if take ~= 0 then
        local ids = redis.call('ZRANGE', key, 0, take > 0 and take - 1 or -1)
        local weight = string.find(key, ':d%d+$') and lifecycle.DURABLE_REF or 1  -- (remove_subscription)
        for i = 1, #ids do lifecycle.release_shared(ids[i], weight) end
        base.call_many('ZREM', key, ids)
        released = released + #ids
      end
      local n = redis.call('ZCARD', key)
      if n == 0 then redis.call('SREM', ended, key) else left, kept = left + n, kept + 1 end
    end
    return released, left + redis.call('SCARD', ended) - kept
  end

  -- Consumer `cid` closed (it is gone from dispatch): return the first `limit` of its messages now (all
  -- when nil) and record the rest as owed, with the fence. Returns how many are owed.
  lifecycle.returns_begin = function(cid, reason, limit)
    redis.call('HSET', lifecycle.closing_key(), cid, reason)
    local _, owed = lifecycle.return_owed(limit, cid)
    if owed > 0 then
      base.due_at(base.P, base.NOW + lifecycle.RETURNS_GRACE_MS)  -- the tick finishes them if the closer dies
    end
    if redis.call('ZCARD', base.K_CINF(cid)) > 0 then
      -- (returned messages score below 0 unless messages are prioritized: then they are spread over the
      -- priority order, and nothing is dispatched until the last is back)
      redis.call('HSET', base.K_META, 'fence', message.prioritized() and '-inf' or '0')
    end
    return owed
  end

  -- Return up to `limit` more messages that closed consumers still hold (all when `limit` is nil), oldest
  -- dispatch first, consumer `only` alone when given, else from at most CLOSING_LOOKS of them when `limit`
  -- is given. Returns how many it returned and how many are still owed (counted over the consumers it
  -- looked at, plus one for each it did not look at: `owed` is 0 only when none is left).
  lifecycle.return_owed = function(limit, only)
    local closing = lifecycle.closing_key()
    local names, sampled = nil, false
    if only then
      names = { only }
    elseif limit and redis.call('HLEN', closing) > lifecycle.CLOSING_LOOKS then
      names, sampled = redis.call('HRANDFIELD', closing, lifecycle.CLOSING_LOOKS), true
    else
      names = redis.call('HKEYS', closing)
    end
    local returned, owed, kept = 0, 0, 0
    if not only then returned, owed = lifecycle.release_ended(limit) end
    if not only then  -- held messages whose transaction lapsed
      local back, due = lifecycle.return_lapsed(limit and limit - returned)
      returned, owed = returned + back, owed + due
    end
    local group_room = limit and GROUP_FREE_CHUNK or -1
    for i = 1, #names do
      local cid = names[i]
      local reason = redis.call('HGET', lifecycle.closing_key(), cid)
      if reason then
        local take = limit and limit - returned or -1
        if take ~= 0 then
          local rcv = tonumber(redis.call('HGET', base.K_C(cid), 'rcv')) or 0
          local held = redis.call('ZRANGE', base.K_CINF(cid), 0, take > 0 and take - 1 or -1, 'WITHSCORES')
          returned = returned + lifecycle.return_messages(cid, held, rcv, reason)
        end
        local left = redis.call('ZCARD', base.K_CINF(cid))
        local groups = 0
        if not base.SUB then  -- (a subscription has no groups)
          local before = group_room > 0 and redis.call('SCARD', base.K_CGRP(cid)) or 0
          groups = free_groups(cid, group_room < 0 and redis.call('SCARD', base.K_CGRP(cid)) or group_room)
          if group_room > 0 then group_room = math.max(0, group_room - (before - groups)) end
        end
        if left == 0 and groups == 0 then
          returns_done(cid)
        else
          owed, kept = owed + left + groups, kept + 1
          redis.call(left == 0 and 'SREM' or 'SADD', lifecycle.closing_held_key(), cid)
        end
      end
    end
    if sampled then owed = owed + redis.call('HLEN', closing) - kept end
    lift_fence()
    return returned, owed
  end

  -- Close consumer `cid` (client close, lapsed lease, abort): spec §1.8 and §3.4. It leaves dispatch, the
  -- exclusive ownership and its groups at once; of the messages it holds, the first `limit` (all when nil)
  -- go back now and the rest are owed (closing_key, return_owed). Returns true (false: no such consumer)
  -- and how many are still owed.
  lifecycle.close_consumer = function(cid, reason, limit)
    local packed = redis.call('HGET', base.K_CONSUMERS, cid)
    if not packed then return false, 0 end
    local def = cmsgpack.unpack(packed)
    redis.call('HDEL', base.K_CONSUMERS, cid)
    redis.call('LREM', base.K_CORDER, 0, cid)
    consumers.gmap.forget_priorities()
    if not base.SUB then consumers.priority_left(tonumber(def.priority) or 0) end  -- (consumers.lua join_order)
    redis.call('ZREM', base.K_LEASES, cid)
    redis.call('SREM', base.K_PASSFULL, cid)
    message.pass_dirty.passfull_key = nil
    lifecycle.recompute_exclusive_owner(def, cid)
    -- Its groups are free from now on: dispatch treats a group whose owner is no consumer any more as
    -- unowned (groups.lua groups.allows: the next message binds it to a new owner, flagged first for it),
    -- and the entries themselves are deleted a chunk per call (return_owed, GROUP_FREE_CHUNK), so a
    -- consumer owning 10,000 groups under a `simple` map costs this call nothing more. Its id stays in
    -- `closing` until they are gone, so a new consumer with the same id cannot inherit them.
    consumers.gmap.create()  -- ActiveMQ creates the group map on the first removal
    local returned = redis.call('ZCARD', base.K_CINF(cid))
    local owed = 0
    if base.SUB and redis.call('HGET', base.K_META, 'durable') ~= '1' then
      -- A non-durable subscription ends with its consumer (subscription_consumer_gone): what it holds is
      -- released with it, not returned first; listed as closing, its window goes with the subscription's.
      redis.call('HSET', lifecycle.closing_key(), cid, reason)
    else
      -- Messages the adapter never received were never delivered: they go back without a bump.
      owed = lifecycle.returns_begin(cid, reason, limit)
    end
    message.reset_pass()
    base.emit('consumer_remove', 'consumer', cid, 'reason', reason, 'returned', returned)
    if base.SUB then
      lifecycle.subscription_consumer_gone(cid, reason)
      owed = owed + redis.call('SCARD', base.TP .. ':ended')
    end
    return true, owed
  end
end

lifecycle.expire_message = function(...) lifecycle.load() return lifecycle.expire_message(...) end
lifecycle.expire_pending = function(...) lifecycle.load() return lifecycle.expire_pending(...) end
lifecycle.discard_pending = function(...) lifecycle.load() return lifecycle.discard_pending(...) end
lifecycle.park = function(...) lifecycle.load() return lifecycle.park(...) end
lifecycle.parked_score = function(...) lifecycle.load() return lifecycle.parked_score(...) end
lifecycle.scheduled_arrived = function(...) lifecycle.load() return lifecycle.scheduled_arrived(...) end
lifecycle.schedule_job = function(...) lifecycle.load() return lifecycle.schedule_job(...) end
lifecycle.fire_scheduled = function(...) lifecycle.load() return lifecycle.fire_scheduled(...) end
lifecycle.publish_firing = function(...) lifecycle.load() return lifecycle.publish_firing(...) end
lifecycle.recompute_exclusive_owner = function(...) lifecycle.load() return lifecycle.recompute_exclusive_owner(...) end
lifecycle.remove_subscription = function(...) lifecycle.load() return lifecycle.remove_subscription(...) end
lifecycle.subscription_consumer_gone = function(...) lifecycle.load() return lifecycle.subscription_consumer_gone(...) end
lifecycle.close_consumer = function(...) lifecycle.load_closing() return lifecycle.close_consumer(...) end
lifecycle.return_messages = function(...) lifecycle.load_closing() return lifecycle.return_messages(...) end
lifecycle.return_owed = function(...) lifecycle.load_closing() return lifecycle.return_owed(...) end
lifecycle.return_held = function(...) lifecycle.load_closing() return lifecycle.return_held(...) end
lifecycle.return_lapsed = function(...) lifecycle.load_closing() return lifecycle.return_lapsed(...) end
lifecycle.returns_begin = function(...) lifecycle.load_closing() return lifecycle.returns_begin(...) end
lifecycle.release_ended = function(...) lifecycle.load_closing() return lifecycle.release_ended(...) end
