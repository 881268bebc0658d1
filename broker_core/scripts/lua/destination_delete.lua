-- Delete a destination with everything in it (BrokerView.removeQueue). Its consumers are gone with it;
-- their adapters learn it from UNKNOWN_CONSUMER on their next call. ARGV: now, registry key, uri[, tally
-- key]. The registry entry goes in this step too, so no reader sees a deletion counted (the tally) while
-- the destination is still listed, and no crash leaves a listed destination without keys.
-- Returns {messages that were in it, 1 if the registry held it}, or -1 (nothing deleted) for a topic that has a
-- subscription: one made after ops/topics.py delete removed the last (a client resubscribing at once),
-- which the caller removes the same way before it calls again, so that none is left behind, its keys and
-- durable registry entry naming a topic that no longer exists. A topic's own keys (its subscription
-- lists, shared store references) go here, in the step that found no subscription. With a tally key (a temporary destination deleted
-- because its connection ended: broker_core/ops/router.py delete_temporary), the deletion is counted there
-- in the same step: `destinations` +1 and `messages` + what it held (a topic's too: its subscriptions' were
-- its own, still here), only when the destination still existed, so deleting it twice counts once.
--@include base
--@allow-oom
base.NOW = tonumber(ARGV[1])
if redis.call('LLEN', base.P .. ':sorder') > 0 then return -1 end
local count = redis.call('HLEN', base.K_MSGS)
local tally = ARGV[4]
if tally and tally ~= '' and redis.call('EXISTS', base.K_META) == 1 then
  redis.call('HINCRBY', tally, 'destinations', 1)
  redis.call('HINCRBY', tally, 'messages', count)
end
-- What it held no longer counts towards the broker's memory usage (flow.lua).
redis.call('HINCRBY', flow.usage, 'used', 0 - (tonumber(redis.call('HGET', base.K_META, 'mem')) or 0))  -- 0 - x: Lua's -(0) is -0, which HINCRBY refuses
-- virtual copies it still owed stop counting against their targets ('memfwd', virtual.lua), and
-- transactions' reservations on it end (flow.lua).
for _, packed in ipairs(redis.call('HVALS', base.K_FWD)) do
  local r = cmsgpack.unpack(packed)
  local charge = tonumber(r[6]) or 0
  if r[2] == 'virtual' and charge > 0 then
    local kind, name = string.match(r[1], '^(%a+)://(.*)$')
    local meta = string.match(base.P, '^(.-):{') .. ':{' .. (kind == 'topic' and 't' or 'q') .. ':' .. name
      .. '}:meta'
    if redis.call('EXISTS', meta) == 1 and redis.call('HINCRBY', meta, 'memfwd', -charge) < 0 then
      redis.call('HSET', meta, 'memfwd', 0)
    end
  end
end
for _, tx in ipairs(redis.call('HKEYS', base.P .. ':memres')) do
  redis.call('HDEL', flow.usage .. ':res', tx .. '|' .. base.P)
end
redis.call('UNLINK', base.P .. ':memres')
local keys = { base.K_META, base.K_POLICY, base.K_MSGS, base.K_PENDING, base.K_INFLIGHT, base.K_REDELIV, base.K_GFIRST, base.K_CONSUMERS, base.K_CORDER,
  base.K_LEASES, base.K_PASSFULL, base.K_GROUPS, base.K_GLRU, base.K_PARKED, base.K_PARKINFO, base.K_FWD, base.K_AUDIT, base.K_EVENTS, base.K_SCHED,
  -- transactions' marks and the messages held for them (includes/lifecycle.lua txacks_key)
  base.P .. ':txacks', base.P .. ':txheld',
  -- maintenance state (broker_core/maintenance.py, scripts/lua/abort.lua)
  base.P .. ':maint', base.P .. ':slowcons', base.P .. ':aborted', base.P .. ':aborted:at',
  -- rate history (broker_core/rates.py): a queue made again under this name starts a history of its own
  base.P .. ':rates', base.P .. ':rates:5s', base.P .. ':rates:1m', base.P .. ':rates:5s:discarded',
  base.P .. ':rates:1m:discarded',
  -- a topic's (none on a queue); UNLINK: a topic holding many messages has large `refs` and `order`, which
  -- Redis frees off its main thread (a DEL of 10,000 references took 20 ms, holding every client)
  base.P .. ':subs', base.P .. ':sorder', base.P .. ':subof', base.P .. ':refs', base.P .. ':order',
  base.P .. ':retain', base.P .. ':recov', base.P .. ':recovmsg' }
for _, cid in ipairs(redis.call('HKEYS', base.K_CONSUMERS)) do
  keys[#keys + 1] = base.K_C(cid)
  keys[#keys + 1] = base.K_CINF(cid)
  keys[#keys + 1] = base.K_COUT(cid)
  keys[#keys + 1] = base.K_CGRP(cid)
end
-- closed consumers whose messages were still being returned (includes/lifecycle.lua return_owed)
for _, cid in ipairs(redis.call('HKEYS', base.P .. ':closing')) do
  keys[#keys + 1] = base.K_C(cid)
  keys[#keys + 1] = base.K_CINF(cid)
  keys[#keys + 1] = base.K_COUT(cid)
  keys[#keys + 1] = base.K_CGRP(cid)  -- (its group entries still to delete)
end
keys[#keys + 1] = base.P .. ':closing'
-- a topic's ended subscriptions' messages still to release (includes/lifecycle.lua remove_subscription)
for _, key in ipairs(redis.call('SMEMBERS', base.P .. ':ended')) do keys[#keys + 1] = key end
keys[#keys + 1] = base.P .. ':ended'
-- a topic's unfinished fan-outs (includes/fanout.lua: each list is named by a queued id)
for _, id in ipairs(redis.call('LRANGE', base.P .. ':fanout', 0, -1)) do keys[#keys + 1] = base.P .. ':fanout:' .. id end
keys[#keys + 1] = base.P .. ':fanout'
keys[#keys + 1] = base.P .. ':fanout:n'
keys[#keys + 1] = base.P .. ':fanout:at'
redis.call('UNLINK', unpack(keys))
return { count, redis.call('ZREM', ARGV[2], ARGV[3]) }
