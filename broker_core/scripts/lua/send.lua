-- Enqueue messages on a queue, then run a dispatch chunk.
-- ARGV: now, budget, origin ('producer', 'commit' (a transaction's), or 'forward' for a message another
-- destination passes on: a dead letter, a moved one or a virtual destination's copy, which the producer
-- limits do not apply to; optionally '+' and a routing plan, includes/virtual.lua), then per message: id,
-- packed. Status 'forwarded': a virtual destination's copies were recorded, nothing is kept here.
-- The budget may be followed by '~' and the calling process's wake-up channel: deliveries pushed to consumers
-- on that channel come back in the reply's tail instead of being published (outbox.lua push_*).
-- Returns {status per message..., the tail (includes/dispatch.lua dispatch.add_tail)}; status 'ok',
-- 'duplicate' (an id already stored: not stored again, counted) or 'expired' (expired on arrival: not
-- enqueued, counted).
-- Producer flow control (includes/flow.lua) applies to origin 'producer' and to 'retry' (the same send
-- again after waiting for space, flow.py); a send that does not fit stores nothing and returns
-- {'', 'full', scope, used, limit, fail at once, timeout ms, bytes needed, the full destination if another
-- (a virtual destination's target)}. Origin 'probe' stores nothing
-- and returns {''} when the messages would fit; 'check' stores nothing and returns {''} when they are within
-- the size and property limits, each message given as id, packed size, packed without its body (calls.py
-- _check).
--@include base
--@include dispatch
--@include virtual
base.NOW = tonumber(ARGV[1])
local budget = tonumber(ARGV[2])
if not budget then  -- '<budget>~<channel>'
  local tilde = string.find(ARGV[2], '~', 1, true)
  budget, outbox.local_channel = tonumber(string.sub(ARGV[2], 1, tilde - 1)), string.sub(ARGV[2], tilde + 1)
end
-- the origin may carry a routing plan (includes/virtual.lua): copies for other destinations.
local origin, plan = virtual.split_origin(ARGV[3])
local missing = base.require_destination()
if missing then return missing end
local unpacked = message.unpack_send(ARGV, origin, origin == 'check' and 3 or 2)
if unpacked.err then return unpacked end
-- 'check': a batch sent in parts has every part's limits checked before the first is stored (ops/flow.py send_parts)
if origin == 'check' then return { '' } end
-- What the stored messages add to the destination is written once after the loop, not per message: the
-- messages, their pending and audit entries, the sequence and enqueued counters, and (with no routing
-- plan, whose copies check the usage as they go) the memory charged. The counters are read here with the
-- memory floor (flow.lua flow.message_charge), which the flow check below needs first: one read for both
-- (and the memory held, 'mem', and the message sizes, message.lua size_note, for the write after the loop).
local counts = redis.call('HMGET', base.K_META, 'seq', 'enqueued', 'cursor', 'memmin', 'mem', 'msgsize')
flow.floor_read(counts[4])  -- (a queue: its meta hash is the one flow charges, flow.meta_key)
-- (not checked: forwards, commits (reserved at the probe), 'exempt': the broker's own sends, a BROWSE's
-- replies after its first, which a producer's send admits: AsyncBroker.manage_scheduler)
local flow_checked = origin == 'producer' or origin == 'retry' or origin == 'probe'
if flow_checked then  -- producer flow control (spec §9.2); 'probe' only asks (a transacted send)
  local need = message.send_need(ARGV, unpacked, 2)
  local full = need > 0 and flow.memory_refusal(need, plan)
  if full then
    if origin == 'producer' then  -- counted and logged once per send, not per retry
      base.meta_incr('blocked_sends')
      base.emit('full', 'scope', full[1], 'used', full[2], 'limit', full[3], 'need', need)
    end
    -- [7] what the refused check needed, [8] 1: the full one drops copies instead (dropOnResourceLimit)
    return { '', 'full', full[1], full[2], full[3], full[4], full[5], need, full[6], full[7], full[8] }
  end
  if origin == 'probe' then flow.reserve(need) return { '' } end  -- held until commit (flow.lua)
end
local audit = base.policy_flag('enableAudit')
local audit_depth = base.policy_num('maxQueueAuditDepth')
-- (made at the size one message's reply takes: a table that grows is rebuilt at each power of two)
local out = { nil, nil, nil, nil }
-- What the messages were before this send: an id still stored (or kept as a repeating job), or enqueued
-- within the audit window, is a duplicate (§12). Read with one command per key for all the messages; for
-- one message (a producer's usual send) with the same three commands and no tables. A single message that
-- can only be stored here (not expired, not a repeating job, no routing plan) is stored by its check:
-- HSETNX stores it unless its id is stored already (`stored_early`; nothing else is written before it).
local single = #ARGV == 5
local was_stored, was_job, was_audited, duplicate_one
local stored_early = false
if single then
  local id, m = ARGV[4], unpacked[4]
  duplicate_one = redis.call('HEXISTS', base.K_SCHED, id) == 1
                  or (audit and redis.call('ZSCORE', base.K_AUDIT, id)) or false
  if not duplicate_one then
    if not plan and not message.is_expired(m) and (tonumber(m[message.REPEAT]) or 0) <= 0 and not message.cron(m) then
      stored_early = redis.call('HSETNX', base.K_MSGS, id, ARGV[5]) == 1
      duplicate_one = not stored_early
    else
      duplicate_one = redis.call('HEXISTS', base.K_MSGS, id) == 1
    end
  end
else
  local ids = {}
  for i = 4, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
  was_stored = base.call_many('HMGET', base.K_MSGS, ids)
  was_job = base.call_many('HMGET', base.K_SCHED, ids)
  was_audited = audit and base.call_many('ZMSCORE', base.K_AUDIT, ids)
end
-- ids this send stored, or kept as a job: the same id again in one send is a duplicate
local now_stored = not single and {} or nil
local seq = base.number(counts[1]) or 0
local first_seq = seq
local stored, charged, lowest = 0, 0, nil
local scheduled = 0  -- of those stored, delayed ones: parked, counted enqueued when they come back
-- the sizes of those counted enqueued (message.lua size_note): sum, smallest, largest
local size_sum, size_min, size_max = 0, nil, nil
-- whether every message was stored or a duplicate: then nothing in the loop changed the memory held
-- ('mem', read above), and the charge goes in the counters' write
local only_kept = true
-- (field, value ... for one HSET; score, member ... for ZADD: made at the size one message takes)
local msgs, pending, audited = { nil, nil }, { nil, nil }, { nil, nil }
-- what the loop reads for each message, as locals: a module's field read per message costs instructions
-- (bench/redis_instructions.py)
local is_expired, pending_score, fresh = message.is_expired, message.pending_score, message.fresh
-- and what the policy decides for all of them, asked once: whether the pending score is more than the
-- sequence (message.pending_score), whether a message without consumers is advised (advisory.no_consumer)
local prioritized = message.prioritized()
local advise_no_consumer = advisory.read_flags()['sendAdvisoryIfNoConsumers']
local PRIORITY, GROUP, PERSISTENT = message.PRIORITY, message.GROUP, message.PERSISTENT
local DELAY, PERIOD, REPEAT = message.DELAY, message.PERIOD, message.REPEAT
local num, emit_message = base.NOW_TEXT.num, base.emit_message
for i = 4, #ARGV, 2 do
  local id, blob, m = ARGV[i], ARGV[i + 1], unpacked[i]
  local k = (i - 2) / 2
  local duplicate
  if single then duplicate = duplicate_one
  else duplicate = was_stored[k] or was_job[k] or (audit and was_audited[k]) or now_stored[id] end
  if duplicate then
    base.meta_incr('duplicates')
    base.emit('duplicate', 'msg', id)
    out[#out + 1] = 'duplicate'
  elseif is_expired(m) then
    -- Expired on arrival: not enqueued (Queue.send), but expired like any other (broker.messageExpired).
    only_kept = false
    base.meta_incr('expired_on_arrival')
    -- not counted expired (Queue.send: "not stored - or added to stats yet"), unless it expired while its
    -- producer waited for space: Queue.send's waiting send counts that one in ExpiredCount
    local counted = origin == 'retry' and 1 or 0
    if counted == 1 then base.meta_incr('expired') end
    -- the Expired advisory carries a copy; `counted`: in `expired` too
    emit_message(blob, 'expire', 'msg', id, 'expiration', tonumber(m[message.EXPIRATION]) or 0, 'on_arrival', 1,
                 'counted', counted)
    forward.dead_letter(id, m, blob, 'expired', tonumber(m[message.EXPIRATION]) or 0)
    out[#out + 1] = 'expired'
  elseif (tonumber(m[REPEAT]) or 0) > 0 or message.cron(m) then
    -- a job kept here (a repeat, a cron schedule); each time it fires, its delivery is routed by the plan (copies then, as
    -- ActiveMQ's scheduler re-sends every repeat to the destination: lifecycle.lua fire_scheduled).
    -- No NoConsumer check here: SchedulerBroker.send keeps the job and does not pass the message on to
    -- the queue (no Queue.messageSent); each firing is checked (fire_scheduled).
    only_kept = false
    local at = lifecycle.job_start(m)
    lifecycle.schedule_job(id, blob, m, at, plan)
    if now_stored then now_stored[id] = true end
    if audit then
      local n = #audited
      audited[n + 1], audited[n + 2] = num(seq), id
    end
    if message.cron(m) then  -- (the expression as sent)
      base.emit('schedule', 'msg', id, 'at', at, 'period', message.schedule_ms(m[PERIOD]), 'repeat', m[REPEAT], 'cron', message.cron(m)[1])
    else
      base.emit('schedule', 'msg', id, 'at', at, 'period', m[PERIOD], 'repeat', m[REPEAT])
    end
    out[#out + 1] = 'scheduled'
  elseif plan and not virtual.route(id, blob, m, plan) then
    -- copies recorded for the plan's targets (in the call above); nothing is kept here.
    only_kept = false
    out[#out + 1] = 'forwarded'
  else
    seq = seq + 1
    stored = stored + 1
    if now_stored then now_stored[id] = true end
    if not stored_early then
      local n = #msgs  -- (once: a table's length is a search each time it is asked)
      msgs[n + 1], msgs[n + 2] = id, blob
    end
    fresh[id] = { blob, m }  -- the dispatch chunk below needs not read it back (message.lua)
    local size = flow.message_charge(#blob)  -- includes/flow.lua
    if plan then flow.memory_charge(#blob) else charged = charged + size end
    if audit then
      local n = #audited
      audited[n + 1], audited[n + 2] = num(seq), id
    end
    local score = prioritized and pending_score(seq, m[PRIORITY]) or seq
    if (tonumber(m[DELAY]) or 0) ~= 0 or (tonumber(m[PERIOD]) or 0) ~= 0 then  -- (message.delayed, inline)
      -- not on the queue until its time (ActiveMQ's scheduler keeps it): counted enqueued, its enqueue
      -- event and NoConsumer check then (lifecycle.lua scheduled_arrived); parked until then. A job due
      -- now (a delay or period given as 0: message.GIVEN_ZERO) comes back in this call's dispatch chunk.
      local at = base.NOW + message.schedule_ms(m[DELAY])
      lifecycle.park(id, at, score, true)
      scheduled = scheduled + 1
      base.emit('schedule', 'msg', id, 'at', at)
    else
      local n = #pending
      pending[n + 1], pending[n + 2] = num(score), id
      size_sum = size_sum + size
      if not size_min or size < size_min then size_min = size end
      if not size_max or size > size_max then size_max = size end
      if not lowest or score < lowest then lowest = score end
      -- (not in K_MSGS yet but stored early: written after the loop)
      emit_message(blob, 'enqueue', 'msg', id, 'priority', num(m[PRIORITY] or 4),
                   'group', m[GROUP] or '', 'size', num(#blob))
      if advise_no_consumer then advisory.no_consumer(id, blob, m[PERSISTENT]) end  -- (includes/advisory.lua)
    end
    out[#out + 1] = 'ok'
  end
end
if stored > 0 then
  if #msgs > 0 then base.call_many('HSET', base.K_MSGS, msgs) end
  local enqueued = num((base.number(counts[2]) or 0) + stored - scheduled)
  if charged > 0 and only_kept then  -- (flow.memory_add's two increments: this one as a value)
    if size_min then
      redis.call('HSET', base.K_META, 'seq', num(seq), 'enqueued', enqueued,
                 'mem', num((base.number(counts[5]) or 0) + charged),
                 'msgsize', message.size_added(counts[6], stored - scheduled, size_sum, size_min, size_max))
    else
      redis.call('HSET', base.K_META, 'seq', num(seq), 'enqueued', enqueued,
                 'mem', num((base.number(counts[5]) or 0) + charged))
    end
    flow.usage_add(charged)
    charged = 0
  elseif size_min then
    redis.call('HSET', base.K_META, 'seq', num(seq), 'enqueued', enqueued,
               'msgsize', message.size_added(counts[6], stored - scheduled, size_sum, size_min, size_max))
  else
    redis.call('HSET', base.K_META, 'seq', num(seq), 'enqueued', enqueued)
  end
end
if lowest then message.pending_add_many(pending, lowest, counts[3]) end
if #audited > 0 then
  base.call_many('ZADD', base.K_AUDIT, audited)
  -- trimmed to its depth each time the sequence passes a multiple of 64, the oldest ids first, at most
  -- 1,024 of them a time (a lowered maxQueueAuditDepth shrinks it over later sends, each call bounded)
  if audit and math.floor(seq / 64) > math.floor(first_seq / 64) then
    local over = redis.call('ZCARD', base.K_AUDIT) - audit_depth
    if over > 0 then redis.call('ZREMRANGEBYRANK', base.K_AUDIT, 0, math.min(over, 1024) - 1) end
  end
end
if charged > 0 then flow.memory_add(charged) end
local dispatched, more, hold = dispatch.chunk(budget)
dispatch.add_tail(out, dispatched, more, hold)
return out
