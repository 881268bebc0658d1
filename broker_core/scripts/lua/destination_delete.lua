-- Delete a destination with everything in it (BrokerView.removeQueue). Its consumers are gone with it;
-- their adapters learn it from UNKNOWN_CONSUMER on their next call. ARGV: now, registry key, uri, tally key
-- ('' for none), chunk, deletions key. The registry entry goes in this step too, so no reader sees a
-- deletion counted (the tally) while the destination is still listed, and no crash leaves a listed
-- destination without keys. So does the deletion's record (`uri` in the deletions zset and its `:tally`
-- hash, written before the deletion's first step: broker_core/ops/admin.py begin_deletion), by which
-- maintenance finishes a deletion whose driver died (Router.finish_deletions).
-- What grows with the data (the forward records of virtual copies still owed, consumers and closed
-- consumers with four keys each, a topic's ended subscriptions' keys and queued fan-outs, transactions'
-- reservations) is drained first, at most `chunk` entries a call (a forward record's blob counted against
-- DRAIN_BYTES too): a call that leaves some returns {'more'} and the caller calls again
-- (broker_core/ops/admin.py delete_destination). Each drained entry goes with what it counted (a copy's
-- charge on its target's 'memfwd'), so a deletion stopped between calls leaves counts right, and whoever
-- finishes it (maintenance, a repeated delete) finds it as it was left; a send or subscription meanwhile is
-- drained or refused (-1) by the next call.
-- Returns {messages that were in it, 1 if the registry held it}, {'more'}, or -1 (nothing deleted) for a
-- topic that has a subscription: one made after ops/topics.py delete removed the last (a client
-- resubscribing at once), which the caller removes the same way before it calls again, so that none is left
-- behind, its keys and durable registry entry naming a topic that no longer exists. A topic's own keys (its
-- subscription lists, shared store references) go here, in the step that found no subscription. With a
-- tally key (a temporary destination deleted because its connection ended: broker_core/ops/router.py
-- delete_temporary), the deletion is counted there in the same step: `destinations` +1 and `messages` +
-- what it held (a topic's too: its subscriptions' were its own, still here), only when the destination
-- still existed, so deleting it twice counts once: a slow driver and maintenance finishing the same
-- deletion (neither makes it again: topic_admin's delete and purge make no destination).
--@include base
--@allow-oom
base.NOW = tonumber(ARGV[1])
if redis.call('LLEN', base.P .. ':sorder') > 0 then return -1 end

-- The drain: `room` entries left in this call.
local room = tonumber(ARGV[5])
local DRAIN_BYTES = 4 * 1024 * 1024  -- forward records' blobs read a call (at least one record)

-- A consumer's (or closed consumer's) keys, its id off the lists that name it.
local function drop_consumer(cid)
  redis.call('UNLINK', base.K_C(cid), base.K_CINF(cid), base.K_COUT(cid), base.K_CGRP(cid))
  redis.call('ZREM', base.K_LEASES, cid)
  redis.call('SREM', base.K_PASSFULL, cid)
end

local function drain()
  -- virtual copies it still owed stop counting against their targets ('memfwd', virtual.lua)
  local bytes = 0
  for _, field in ipairs(room > 0 and redis.call('HRANDFIELD', base.K_FWD, room) or {}) do
    bytes = bytes + redis.call('HSTRLEN', base.K_FWD, field)
    if bytes > DRAIN_BYTES and room < tonumber(ARGV[5]) then room = 0 break end
    local r = cmsgpack.unpack(redis.call('HGET', base.K_FWD, field))
    local charge = tonumber(r[6]) or 0
    if r[2] == 'virtual' and charge > 0 then
      local kind, name = string.match(r[1], '^(%a+)://(.*)$')
      local meta = string.match(base.P, '^(.-):{') .. ':{' .. (kind == 'topic' and 't' or 'q') .. ':' .. name
        .. '}:meta'
      if redis.call('EXISTS', meta) == 1 and redis.call('HINCRBY', meta, 'memfwd', -charge) < 0 then
        redis.call('HSET', meta, 'memfwd', 0)
      end
    end
    redis.call('HDEL', base.K_FWD, field)
    room = room - 1
  end
  -- transactions' reservations on it end (flow.lua)
  for _, tx in ipairs(room > 0 and redis.call('HRANDFIELD', base.P .. ':memres', room) or {}) do
    flow.reservation_end(flow.usage_res, tx .. '|' .. base.P)
    flow.reservation_end(base.P .. ':memres', tx)
    room = room - 1
  end
  -- consumers, from the dispatch order (so the ones left are still served, in order, if the deletion
  -- stops here), then any the order does not name; their priority counts go, so the next add sorts
  -- whoever is left (includes/consumers.lua join_order)
  local ids = room > 0 and (redis.call('LPOP', base.K_CORDER, room) or {}) or {}
  if #ids < room then
    for _, cid in ipairs(redis.call('HRANDFIELD', base.K_CONSUMERS, room - #ids)) do ids[#ids + 1] = cid end
  end
  if #ids > 0 then
    redis.call('UNLINK', base.P .. ':prios')
    redis.call('HDEL', base.K_META, 'ordered')
  end
  for _, cid in ipairs(ids) do
    drop_consumer(cid)
    redis.call('HDEL', base.K_CONSUMERS, cid)
  end
  room = room - #ids
  for _, cid in ipairs(room > 0 and redis.call('HRANDFIELD', base.P .. ':closing', room) or {}) do
    drop_consumer(cid)
    redis.call('HDEL', base.P .. ':closing', cid)
    redis.call('SREM', base.P .. ':closing:held', cid)  -- (includes/lifecycle.lua closing_held_key)
    room = room - 1
  end
  -- a topic's ended subscriptions' messages still to release (includes/lifecycle.lua remove_subscription):
  -- they go with the topic's store, counted with it in the last call, not released one by one (a deletion
  -- that stops here leaves them stored, and counted in memory, until it is done again)
  for _, key in ipairs(room > 0 and redis.call('SPOP', base.P .. ':ended', room) or {}) do
    redis.call('UNLINK', key)
    room = room - 1
  end
  -- a topic's unfinished fan-outs (includes/fanout.lua), oldest first (their messages likewise)
  for _, id in ipairs(room > 0 and (redis.call('LPOP', base.P .. ':fanout', room) or {}) or {}) do
    redis.call('UNLINK', base.P .. ':fanout:' .. id)  -- (a list shared by a send's messages: its last's)
    redis.call('HDEL', base.P .. ':fanout:n', id)
    redis.call('HDEL', base.P .. ':fanout:at', id)
    room = room - 1
  end
  return redis.call('HLEN', base.K_FWD) + redis.call('HLEN', base.P .. ':memres')
    + redis.call('HLEN', base.K_CONSUMERS) + redis.call('HLEN', base.P .. ':closing')
    + redis.call('SCARD', base.P .. ':ended') + redis.call('LLEN', base.P .. ':fanout') == 0
end
if not drain() then return { 'more' } end

local count = redis.call('HLEN', base.K_MSGS)
local tally = ARGV[4]
if tally ~= '' and redis.call('EXISTS', base.K_META) == 1 then
  redis.call('HINCRBY', tally, 'destinations', 1)
  redis.call('HINCRBY', tally, 'messages', count)
end
-- What it held no longer counts towards the broker's memory usage (flow.lua).
redis.call('HINCRBY', flow.usage, 'used', 0 - (tonumber(redis.call('HGET', base.K_META, 'mem')) or 0))  -- 0 - x: Lua's -(0) is -0, which HINCRBY refuses
local keys = { base.K_META, base.K_POLICY, base.K_MSGS, base.K_PENDING, base.K_INFLIGHT, base.K_REDELIV, base.K_GFIRST, base.K_CONSUMERS, base.K_CORDER,
  base.K_LEASES, base.K_PASSFULL, base.K_GROUPS, base.K_GLRU, base.K_PARKED, base.K_PARKINFO, base.K_FWD, base.K_AUDIT, base.K_EVENTS, base.K_SCHED,
  -- transactions' marks and the messages held for them (includes/lifecycle.lua txacks_key)
  base.P .. ':txacks', base.P .. ':txheld',
  -- maintenance state (broker_core/maintenance.py, scripts/lua/abort.lua)
  base.P .. ':maint', base.P .. ':slowcons', base.P .. ':aborted', base.P .. ':aborted:at',
  -- the consumers' priority counts (includes/consumers.lua join_order)
  base.P .. ':prios',
  -- its open browsers (scripts/lua/browsers.lua)
  base.P .. ':browsers', base.P .. ':browsers:def',
  -- closed consumers whose windows still hold messages (includes/lifecycle.lua closing_held_key)
  base.P .. ':closing:held',
  -- rate history (broker_core/rates.py): a queue made again under this name starts a history of its own
  base.P .. ':rates', base.P .. ':rates:5s', base.P .. ':rates:1m', base.P .. ':rates:5s:discarded',
  base.P .. ':rates:1m:discarded',
  -- a topic's (none on a queue); UNLINK: a topic holding many messages has large `refs` and `order`, which
  -- Redis frees off its main thread (a DEL of 10,000 references took 20 ms, holding every client)
  base.P .. ':subs', base.P .. ':sorder', base.P .. ':sprio', base.P .. ':sprio:build', base.P .. ':subof', base.P .. ':refs',
  base.P .. ':order',
  base.P .. ':retain', base.P .. ':recov', base.P .. ':recovmsg' }
keys[#keys + 1] = base.P .. ':closing'
keys[#keys + 1] = base.P .. ':ended'
keys[#keys + 1] = base.P .. ':memres'
keys[#keys + 1] = base.P .. ':fanout'
keys[#keys + 1] = base.P .. ':fanout:n'
keys[#keys + 1] = base.P .. ':fanout:at'
redis.call('UNLINK', unpack(keys))
redis.call('ZREM', ARGV[6], ARGV[3])  -- its deletion's record: finished
redis.call('HDEL', ARGV[6] .. ':tally', ARGV[3])
return { count, redis.call('ZREM', ARGV[2], ARGV[3]) }
