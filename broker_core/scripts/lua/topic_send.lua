-- Publish messages on a topic (spec §7.1): each message is stored once and put in the pending list of
-- every subscription it matches (selector, noLocal), which then runs a dispatch chunk; a message no
-- subscription matches is dropped and counted ('no_subscription'). Non-durable subscriptions then apply
-- the topic slow rule and their pending-message limit (includes/topic.lua). A pattern matching the topic
-- one of whose wildcard subscriptions takes the message gets a copy through the forwarding hash
-- (includes/wildcard.lua); a message only they take is not dropped, one nobody takes is 'no_subscription'.
-- KEYS[1] = the topic's prefix. ARGV: now, budget, origin ('producer', 'forward' or 'check'), then per message:
-- id, packed, retain ('' | 'set' | 'clear': ActiveMQ.Retain, decided by topics.pack_for_topic), retained copy.
-- A delayed or repeating message is kept as a job on the topic's own keys (lifecycle.lua schedule_job) and
-- published to the subscriptions of each firing's time, as ActiveMQ's SchedulerBroker sends it to the topic.
-- Returns {status per message..., the tail (includes/dispatch.lua dispatch.add_tail, with the subscription keys
-- whose pass has more)}; statuses as send.lua's. Flags: 1 a pass has more, 2 forwards wait, 4 a fan-out is unfinished
-- (includes/fanout.lua: the caller runs topic_fanout.lua until its messages are matched).
--@include base
--@include topic
--@include virtual
--@include fanout
base.NOW = tonumber(ARGV[1])
-- the origin may carry a routing plan (includes/virtual.lua): composite topics,
-- virtual topics' consumer queues. Copies are recorded in the same step; operations.forward delivers them.
local origin, plan = virtual.split_origin(ARGV[3])
local missing = base.require_destination()
if missing then return missing end
-- (a check's messages: id, packed size, packed without its body, as send.lua's)
local step = origin == 'check' and 3 or 4
local unpacked = message.unpack_send(ARGV, origin, step)
if unpacked.err then return unpacked end
if origin == 'check' then return { '' } end  -- limits checked, nothing stored (as send.lua)
if origin == 'producer' or origin == 'retry' then  -- producer flow control, as send.lua (flow.lua)
  local need = message.send_need(ARGV, unpacked, 4)
  local full = need > 0 and flow.memory_refusal(need, plan)  -- the copies' targets count (flow.lua)
  if full then
    if origin == 'producer' then
      base.meta_incr('blocked_sends')
      base.emit('full', 'scope', full[1], 'used', full[2], 'limit', full[3], 'need', need)
    end
    -- [7] what the refused check needed, [8] 1: the full one drops copies instead (dropOnResourceLimit)
    return { '', 'full', full[1], full[2], full[3], full[4], full[5], need, full[6], full[7], full[8] }
  end
end

local audit = base.policy_flag('enableAudit')
local audit_depth = base.policy_num('maxQueueAuditDepth')
-- (the definitions of a call's worth of them: the others' keys, `unread`, go to the fan-out's later calls)
local subs, unread = topic.subscriptions(fanout.MAX_VISITS)
-- Wildcard subscriptions (includes/wildcard.lua): the registered patterns matching this topic and their
-- subscriptions, read in this step; an accepted message owes a copy to each pattern one of whose
-- subscriptions takes it, recorded below and delivered by operations.forward. A pattern's own pseudo-topic matches none and keeps no recovery buffer (a
-- retroactive wildcard subscription is refused, topic_ops.subscribe).
-- (one local: the scripts' main chunk is close to Lua's 200 locals)
local wild = wildcard.for_send()
local touched, touched_order = {}, {}
-- A send matches until its selector work reaches a call's worth, or it has given messages to as many
-- subscriptions as a call may (fanout.full); the rest of its fan-out, and all of it while an
-- earlier send's is unfinished, goes on in the calls after it (includes/fanout.lua).
local deferring = fanout.waiting()
local out = {}
for i = 4, #ARGV, 4 do
  local id, blob, m = ARGV[i], ARGV[i + 1], unpacked[i]
  local repeats = tonumber(m[message.REPEAT]) or 0
  if redis.call('HEXISTS', base.K_MSGS, id) == 1 or redis.call('HEXISTS', base.K_SCHED, id) == 1
     or (audit and redis.call('ZSCORE', base.K_AUDIT, id)) then
    base.meta_incr('duplicates')
    base.emit('duplicate', 'msg', id)
    out[#out + 1] = 'duplicate'
  elseif message.is_expired(m) then
    base.meta_incr('expired_on_arrival')
    base.meta_incr('expired')  -- (Topic.send counts it in ExpiredCount; Queue.send does not)
    -- the Expired advisory carries a copy, as send.lua's; `counted`: in `expired` too
    base.emit_message(blob, 'expire', 'msg', id, 'expiration', tonumber(m[message.EXPIRATION]) or 0, 'on_arrival', 1,
                      'counted', 1)
    forward.dead_letter(id, m, blob, 'expired', tonumber(m[message.EXPIRATION]) or 0)
    out[#out + 1] = 'expired'
  elseif repeats > 0 or message.cron(m) then
    -- a job kept on the topic (a repeat, a cron schedule), as a queue's (send.lua): each firing is routed by the plan and published
    -- to the subscriptions of its time (lifecycle.lua fire_scheduled); counted enqueued then. In the audit
    -- now, as a queue's job: its deliveries are '<id>#<n>'.
    local at = lifecycle.job_start(m)
    lifecycle.schedule_job(id, blob, m, at, plan, ARGV[i + 2], ARGV[i + 3])
    if audit then redis.call('ZADD', base.K_AUDIT, base.meta_incr('seq'), id) end
    if message.cron(m) then  -- (the expression as sent)
      base.emit('schedule', 'msg', id, 'at', at, 'period', message.schedule_ms(m[message.PERIOD]), 'repeat', m[message.REPEAT], 'cron', message.cron(m)[1])
    else
      base.emit('schedule', 'msg', id, 'at', at, 'period', message.schedule_ms(m[message.PERIOD]), 'repeat', m[message.REPEAT])
    end
    out[#out + 1] = 'scheduled'
  elseif not virtual.route(id, blob, m, plan) then
    out[#out + 1] = 'forwarded'  -- a forward-only composite topic keeps nothing
  elseif message.delayed(m) then
    -- Its copies were recorded above, with the delay, as a queue's (send.lua); the topic keeps it as a
    -- job with one firing (ActiveMQ's SchedulerBroker sends it to the topic when due), published then
    -- under its own id to the subscriptions of that time (one due now, a delay or period given as 0,
    -- fires in this call's dispatch chunk). Not in the audit: its firing comes back here under the same
    -- id (the job's entry is the duplicate check until then).
    local at = base.NOW + message.schedule_ms(m[message.DELAY])
    lifecycle.schedule_job(id, blob, m, at, nil, ARGV[i + 2], ARGV[i + 3])
    base.emit('schedule', 'msg', id, 'at', at)
    out[#out + 1] = 'ok'
  else
    local seq = base.meta_incr('seq')
    if audit then
      redis.call('ZADD', base.K_AUDIT, seq, id)
      if seq % 64 == 0 then  -- trimmed to its depth, at most 1,024 ids a time (send.lua)
        local over = redis.call('ZCARD', base.K_AUDIT) - audit_depth
        if over > 0 then redis.call('ZREMRANGEBYRANK', base.K_AUDIT, 0, math.min(over, 1024) - 1) end
      end
    end
    base.meta_incr('enqueued')
    message.size_note(flow.message_charge(#blob))  -- (Topic.dispatch: before it is matched)
    if not wild.is_pattern then topic.recovery_add(id, ARGV[i + 3] ~= '' and ARGV[i + 3] or blob, seq, ARGV[i + 2]) end
    local matched, view, rest = {}, nil, deferring and 1 or nil
    if not deferring then
      local takers = #touched_order  -- (the subscriptions that take messages in this call)
      for k, s in ipairs(subs) do
        if fanout.full(takers) then
          rest, deferring = k, true
          break
        end
        local ok
        ok, view = topic.matches(s, id, m, view)
        fanout.tried()
        if ok then
          matched[#matched + 1] = s
          if not touched[s.key] then takers = takers + 1 end
        end
      end
      if unread and not rest then rest, deferring = #subs + 1, true end
    end
    -- the matching patterns some of whose subscriptions take it (selector, noLocal) get a copy, those of a
    -- call's worth (wildcard.MAX_PATTERNS); the others are decided by the fan-out's calls, and all of them
    -- for a message deferred already (after its subscriptions: each pattern's copies in send order)
    local takers, left = {}, wild.patterns
    if not rest and wild.unbuilt then  -- (the patterns not known yet: the fan-out decides them, fanout.run)
      rest, deferring = #subs + 1, true
    elseif not rest then
      takers, view, left = wildcard.takers(wild, wild.patterns, id, m, view, topic.matches, forward.work_spent)
      if left then rest, deferring = #subs + 1, true end
    end
    local copies = #takers
    if copies > 0 then fanout.copy(wild, id, blob, takers) end  -- (flag 2: the caller delivers them now)
    -- a firing of the topic's job (ops/forward.py publishes it): its enqueue names the job, as a queue's
    -- firing's does (lifecycle.lua fire_scheduled, scheduled_arrived)
    local job = origin == 'forward' and message.job_of(m) or nil
    if rest then
      -- stored now, its events written when its fan-out is done (fanout.finish)
      fanout.defer(id, blob, seq, matched, subs, rest, copies, job, unread, left, left == wild.patterns)
    elseif #matched == 0 and copies == 0 then
      -- Topic.onMessageWithNoConsumers: nobody, exact or wildcard, takes it, so it is not stored.
      base.meta_incr('no_subscription')
      base.emit('no_subscription', 'msg', id, 'priority', base.NOW_TEXT.num(m[message.PRIORITY] or 4), 'size', base.NOW_TEXT.num(#blob))
      advisory.no_consumer(id, blob, m[message.PERSISTENT])  -- sendAdvisoryIfNoConsumers (includes/advisory.lua)
    elseif #matched == 0 then
      -- only wildcard subscriptions take it: their copies hold it, nothing is stored here
      topic.enqueued(id, m, #blob, job, 'subscriptions', 0, 'wildcards', copies)
    else
      topic.store(id, blob, topic.refs_of(matched), seq)
    end
    if not rest and #matched > 0 then
      if copies == 0 then
        topic.enqueued(id, m, #blob, job, 'subscriptions', #matched)
      else
        topic.enqueued(id, m, #blob, job, 'subscriptions', #matched, 'wildcards', copies)
      end
    end
    for _, s in ipairs(matched) do  -- (those matched before a cut take it now too)
      if not touched[s.key] then
        touched[s.key] = { s = s, ids = {}, msgs = {} }
        touched_order[#touched_order + 1] = s.key
      end
      local entry = touched[s.key]
      entry.ids[#entry.ids + 1] = id
      entry.msgs[#entry.msgs + 1] = m
    end
    out[#out + 1] = 'ok'
  end
end
fanout.seal()  -- (the messages queued share one list of subscription keys)
message.sizes_write(base.TP .. ':meta')

local dispatched, flags, hold, more_keys = topic.deliver(touched, touched_order, tonumber(ARGV[2]))
-- the topic's own jobs that are due fire now (a repeat without a delay: its first firing), as a queue's
-- send fires its own (dispatch.chunk); each is published by the caller (flag 2, lifecycle.lua publish_firing)
lifecycle.fire_topic_jobs(dispatch.UNPARK_PER_CALL)
flags = forward.with_flag(flags)
if deferring then flags = bit.bor(flags, 4) end  -- the caller goes on with the fan-out (topic_fanout.lua)
dispatch.add_tail(out, dispatched, flags, hold, more_keys)
return out
