-- Register a consumer (spec §1.3, §2, §3.6) and dispatch to it.
-- ARGV: now, budget, consumer id, packed definition, lease ms, requested prefetch (-1 = client default).
-- The policy's queuePrefetch applies only to a consumer that kept the client default (spec §1.5).
-- Returns {exclusive owner, effective prefetch, the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
NOW = tonumber(ARGV[1])
local missing = require_destination()
if missing then return missing end
local cid, packed, lease_ms = ARGV[3], ARGV[4], tonumber(ARGV[5])
local prefetch = tonumber(ARGV[6])
if prefetch < 0 or prefetch == 1000 then prefetch = policy_num('queuePrefetch') end
if redis.call('HEXISTS', K_CONSUMERS, cid) == 1 then
  return fail('CONSUMER_EXISTS', 'consumer ' .. cid .. ' is already registered on this destination')
end
-- The id of a closed consumer whose messages are still being returned (its keys are still in use): the
-- caller returns them (return_owed.lua) and asks again.
if redis.call('HEXISTS', P .. ':closing', cid) == 1 then return { 'closing' } end
local def = cmsgpack.unpack(packed)
local before = redis.call('HLEN', K_CONSUMERS)
redis.call('HSET', K_CONSUMERS, cid, packed)
redis.call('HDEL', P .. ':aborted', cid)  -- a reused id does not inherit an old abort notice
redis.call('ZREM', P .. ':aborted:at', cid)
redis.call('HSET', K_C(cid), 'n', 0, 'ext', 0, 'groups', 0, 'dispatched', 0, 'acked', 0, 'added', NOW,
           'prefetch', prefetch)
redis.call('ZADD', K_LEASES, NOW + lease_ms, cid)
due_at(P, NOW + lease_ms + 1)  -- the reaper's visit when it lapses
redis.call('RPUSH', K_CORDER, cid)
local cons = consumers.load()
consumers.gmap.note_priorities(cons)
consumers.sort(cons)
consumers.save_order(cons)

-- Exclusive ownership: the first wins; a newcomer takes over only with priority 127 or strictly higher.
if def.exclusive or policy_flag('allConsumersExclusiveByDefault') then
  local owner = redis.call('HGET', K_META, 'owner')
  local take = (not owner or owner == '')
  if not take then
    local current = consumers.find(owner)
    local priority = tonumber(def.priority) or 0
    take = current == nil or priority == 127 or priority > current.priority
  end
  if take then
    redis.call('HSET', K_META, 'owner', cid)
    emit('exclusive_owner', 'consumer', cid)
  end
end

-- A consumer arriving at an empty destination may hold dispatch back (never blocking Redis).
if before == 0 then
  local needed = policy_num('consumersBeforeDispatchStarts')
  local wait = policy_num('timeBeforeDispatchStarts')
  if needed > 0 then
    if wait <= 0 then wait = 1000 end
    redis.call('HSET', K_META, 'hold_until', NOW + wait)
    due_at(P, NOW + wait)
  elseif wait > 0 then
    redis.call('HSET', K_META, 'hold_until', NOW + wait)
    due_at(P, NOW + wait)
  end
end

-- Mid-pass, the newcomer waits for the next pass so it sees messages from the head in order.
message.consumer_joined(cid)
emit('consumer_add', 'consumer', cid, 'priority', def.priority or 0, 'exclusive', def.exclusive and 1 or 0,
     'prefetch', prefetch, 'selector', def.selector_text or '')
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ redis.call('HGET', K_META, 'owner') or '', prefetch, nil, nil, nil }, dispatched, more, hold)
