-- Register a consumer (spec §1.3, §2, §3.6) and dispatch to it.
-- ARGV: now, budget, consumer id, packed definition, lease ms, requested prefetch (-1 = client default),
-- the consumers the queue may have (SIGNALBOX_MAX_CONSUMERS; 0: no limit).
-- The policy's queuePrefetch applies only to a consumer that kept the client default (spec §1.5).
-- Returns {exclusive owner, effective prefetch, the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local missing = base.require_destination()
if missing then return missing end
local cid, packed, lease_ms = ARGV[3], ARGV[4], tonumber(ARGV[5])
local prefetch = tonumber(ARGV[6])
if prefetch < 0 or prefetch == 1000 then prefetch = base.policy_num('queuePrefetch') end
if redis.call('HEXISTS', base.K_CONSUMERS, cid) == 1 then
  return base.fail('CONSUMER_EXISTS', 'consumer ' .. cid .. ' is already registered on this destination')
end
-- The id of a closed consumer whose messages are still being returned (its keys are still in use): the
-- caller returns them (return_owed.lua) and asks again.
if redis.call('HEXISTS', base.P .. ':closing', cid) == 1 then return { 'closing' } end
local before = redis.call('HLEN', base.K_CONSUMERS)
-- The dispatch pass and an add that sorts the order read every consumer: their number bounds those calls'
-- work (broker_core/model.py MAX_CONSUMERS). Refused before anything is written.
local most = tonumber(ARGV[7]) or 0
if most > 0 and before >= most then
  return base.fail('TOO_MANY_CONSUMERS', before .. ' consumers; the limit is ' .. most .. ' (SIGNALBOX_MAX_CONSUMERS)')
end
local def = cmsgpack.unpack(packed)
redis.call('HSET', base.K_CONSUMERS, cid, packed)
redis.call('HDEL', base.P .. ':aborted', cid)  -- a reused id does not inherit an old abort notice
redis.call('ZREM', base.P .. ':aborted:at', cid)
redis.call('HSET', base.K_C(cid), 'n', 0, 'ext', 0, 'groups', 0, 'dispatched', 0, 'acked', 0, 'added', base.NOW,
           'prefetch', prefetch)
redis.call('ZADD', base.K_LEASES, base.NOW + lease_ms, cid)
base.due_at(base.P, base.NOW + lease_ms + 1)  -- the reaper's visit when it lapses
-- (its place in the order without reading the other consumers: includes/consumers.lua join_order)
consumers.join_order(cid, tonumber(def.priority) or 0, before)

-- Exclusive ownership: the first wins; a newcomer takes over only with priority 127 or strictly higher.
if def.exclusive or base.policy_flag('allConsumersExclusiveByDefault') then
  local owner = redis.call('HGET', base.K_META, 'owner')
  local take = (not owner or owner == '')
  if not take then
    local current = consumers.find(owner)
    local priority = tonumber(def.priority) or 0
    take = current == nil or priority == 127 or priority > current.priority
  end
  if take then
    redis.call('HSET', base.K_META, 'owner', cid)
    base.emit('exclusive_owner', 'consumer', cid)
  end
end

-- A consumer arriving at an empty destination may hold dispatch back (never blocking Redis).
if before == 0 then
  local needed = base.policy_num('consumersBeforeDispatchStarts')
  local wait = base.policy_num('timeBeforeDispatchStarts')
  if needed > 0 then
    if wait <= 0 then wait = 1000 end
    redis.call('HSET', base.K_META, 'hold_until', base.NOW + wait)
    base.due_at(base.P, base.NOW + wait)
  elseif wait > 0 then
    redis.call('HSET', base.K_META, 'hold_until', base.NOW + wait)
    base.due_at(base.P, base.NOW + wait)
  end
end

-- Mid-pass, the newcomer waits for the next pass so it sees messages from the head in order.
message.consumer_joined(cid)
base.emit('consumer_add', 'consumer', cid, 'priority', def.priority or 0, 'exclusive', def.exclusive and 1 or 0,
     'prefetch', prefetch, 'selector', def.selector_text or '')
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ redis.call('HGET', base.K_META, 'owner') or '', prefetch, nil, nil, nil }, dispatched, more, hold)
