-- Durable subscriptions' administration (spec §7.4). KEYS[1] = the topic's prefix. ARGV: now, op, ...
--   unsubscribe key client name -> messages dropped with it. Refused while a consumer is attached
--       ("Durable consumer is in use") and for a missing subscription (ActiveMQ's text).
--   expire_offline timeout from looks removals -> {where the next call starts in :sorder (-1: done), then
--       the keys of the durable subscriptions removed for having been offline at least `timeout` ms
--       (offlineDurableSubscriberTimeout; TopicRegion.doCleanup), with their messages}: at most `looks`
--       subscriptions looked at, from index `from`, and `removals` removed.
--   delete budget -> up to `budget` subscriptions removed with their messages (the topic is being deleted):
--       {messages they held (each subscription's own count, as an unsubscribe's), subscriptions left}.
--   release key field uri -> the durable subscription `key` removed (with its messages) because its key is
--       being subscribed on another topic (TopicRegion.addConsumer); refused while a consumer is attached.
--       Does nothing unless the registry still names this topic (`uri`). Returns the messages dropped.
--   limits from count -> {where the next call starts in :sorder (-1: done), then key, pending-message limit
--       in force, ...} for the subscriptions at indexes `from` to from + count - 1 (changes nothing): the
--       value topic.after_send applies (§8.5; -1 = unlimited, and for durable subscriptions, which have none).
--   drop_idle lease... -> a wildcard pattern's pseudo-topic whose last subscription went: its keys removed
--       once no forward waits there and no job (`lease...`: the maintenance jobs' names) holds a lease;
--       1 if removed, 0 if it must wait (includes/wildcard.lua wildcard.drop_idle).
-- Each removal forgets the key's registry entry (<ns>:durables) in the same step (topic.unregister).
--@include base
--@include topic
--@allow-oom
base.NOW = tonumber(ARGV[1])
local op = ARGV[2]
local topic_uri = redis.call('HGET', base.TP .. ':meta', 'uri')
if op == 'unsubscribe' then
  local key, client, name = ARGV[3], ARGV[4], ARGV[5]
  if not redis.call('HGET', base.TP .. ':subs', key) then
    return base.fail('NO_SUBSCRIPTION', 'No durable subscription exists for clientID: ' .. client ..
                ' and subscriptionName: ' .. name)
  end
  topic.switch(key)
  if (redis.call('HGET', base.K_META, 'active') or '') ~= '' then
    return base.fail('DURABLE_IN_USE', 'Durable consumer is in use')
  end
  topic.unregister(topic_uri)
  return lifecycle.remove_subscription('unsubscribed')
elseif op == 'release' then
  local key, field, uri = ARGV[3], ARGV[4], ARGV[5]
  if redis.call('HGET', topic.registry, field) ~= uri then return 0 end
  local dropped = 0
  if redis.call('HGET', base.TP .. ':subs', key) then
    topic.switch(key)
    if (redis.call('HGET', base.K_META, 'active') or '') ~= '' then
      return base.fail('DURABLE_IN_USE', 'Durable consumer is in use')
    end
    dropped = lifecycle.remove_subscription('changed')
  end
  redis.call('HDEL', topic.registry, field)
  return dropped
elseif op == 'expire_offline' then
  -- From index `from` of :sorder on, at most `looks` subscriptions looked at and `removals` removed a call
  -- (a topic with 5,000 took 240-920 ms in one call: docs/benchmarks.md, "Session 29"); the caller calls
  -- again from where this one stopped (ops/topics.py expire_offline_durables). The keys of those removed
  -- leave :sorder, so the next call starts that many places earlier. (A subscription another caller
  -- removes between two calls moves the rest one place forward: one of them is looked at in the next run.)
  local timeout, from, looks, removals = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local keys = redis.call('LRANGE', base.TP .. ':sorder', from, from + looks - 1)
  local removed, looked = {}, 0
  for _, key in ipairs(keys) do
    if #removed >= removals then break end
    looked = looked + 1
    if string.byte(key) == 100 then  -- a durable subscription's (topics.durable_key; lifecycle.ref_weight)
      local state = redis.call('HMGET', base.TP .. ':s:' .. key .. ':meta', 'active', 'offline_since')
      local since = tonumber(state[2] or '')
      if (state[1] or '') == '' and since and base.NOW - since >= timeout then
        topic.switch(key)
        topic.unregister(topic_uri)
        lifecycle.remove_subscription('offline_timeout')
        topic.switch(nil)
        removed[#removed + 1] = key
      end
    end
  end
  local more = looked < #keys or #keys == looks
  return { more and from + looked - #removed or -1, unpack(removed) }
elseif op == 'limits' then
  -- `count` subscriptions a call (each one's consumer loaded: 10,000 made one call of 275 ms); the caller
  -- calls again from where this one stopped (ops/topics.py pending_limits). In :sorder's order, whatever
  -- the dispatch policy (asking turns no roundRobin start). A subscription removed between two calls moves
  -- the rest one place forward: one of them is left out, its limit read as -1 (unknown) by the caller.
  local from, count = tonumber(ARGV[3]), tonumber(ARGV[4])
  local keys = redis.call('LRANGE', base.TP .. ':sorder', from, from + count - 1)
  local defs = #keys > 0 and redis.call('HMGET', base.TP .. ':subs', unpack(keys)) or {}
  local out = { #keys == count and from + count or -1 }
  for i, key in ipairs(keys) do
    if defs[i] then  -- (a key listed without its definition is no subscription)
      local s, limit = { key = key, def = cmsgpack.unpack(defs[i]) }, -1
      if not s.def.durable then
        topic.switch(key)
        local c = consumers.load()[1]
        if c then limit = topic.pending_limit(c.prefetch, s) end
        topic.switch(nil)
      end
      out[#out + 1] = key
      out[#out + 1] = limit
    end
  end
  return out
elseif op == 'delete' then
  -- At most `budget` subscriptions a call, from the head of :sorder (a topic with thousands of them took
  -- 300 ms in one call); the caller calls again while some are left (ops/topics.py delete). Subscriptions
  -- made between calls go too.
  local budget = tonumber(ARGV[3])
  local dropped = 0
  local keys = redis.call('LRANGE', base.TP .. ':sorder', 0, budget - 1)
  -- (the priority policy's order goes first: each removal's LREM would walk it from its head, where these
  -- keys are not; without it a priority send reads them all, and rebuilds it, topic.lua)
  redis.call('DEL', base.TP .. ':sprio', base.TP .. ':sprio:build')  -- (and a build of it, topic.lua)
  redis.call('HDEL', base.TP .. ':meta', 'sprio_walk', 'sprio_moved', 'sprio_seq')
  local defs = #keys > 0 and redis.call('HMGET', base.TP .. ':subs', unpack(keys)) or {}
  for i, key in ipairs(keys) do
    if defs[i] then
      topic.switch(key)
      if cmsgpack.unpack(defs[i]).durable then topic.unregister(topic_uri) end
      dropped = dropped + lifecycle.remove_subscription('destination_deleted')
      topic.switch(nil)
    else  -- (a listed key without its definition: off the list, so the next call goes on past it)
      redis.call('LREM', base.TP .. ':sorder', 1, key)
    end
  end
  -- what they held goes with the topic's messages, not released one by one: destination_delete.lua drains
  -- the ended keys a chunk a call (here every call would read all those earlier calls and subscriptions
  -- that ended before left in `:ended`, thousands of keys)
  local left = redis.call('LLEN', base.TP .. ':sorder')
  -- (not on a topic gone already, deleted meanwhile by another driver of its deletion: its meta made
  -- again would be counted again by the deletion's last step, destination_delete.lua)
  if left == 0 and redis.call('EXISTS', base.TP .. ':meta') == 1 then topic.recovery_release_all() end
  return { dropped, left }
elseif op == 'drop_idle' then
  return wildcard.drop_idle({ unpack(ARGV, 3) })
end
return redis.error_reply('INVALID_OPERATION unknown topic operation ' .. tostring(op))
