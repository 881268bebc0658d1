-- Subscribe a consumer to a topic (spec §7.2-§7.5): a non-durable subscription is created for it; a
-- durable one (client id + subscription name) is created, re-activated, or replaced when its selector or
-- noLocal changed (its messages dropped). A second active consumer on a durable subscription is refused
-- with ActiveMQ's text. Retroactive consumers get what the recovery policy kept.
-- KEYS[1] = the topic's prefix. ARGV: now, budget, consumer id, packed consumer definition, lease ms,
-- requested prefetch (-1 = client default), subscription key, packed subscription definition,
-- retroactive ('1'/'0'), client id, subscription name, registry field, topic uri, the stored messages a new
-- retroactive durable's catch-up examines in this call at most (includes/topic.lua topic.catch_up).
-- Returns {effective prefetch, recovered, 'new'|'changed'|'existing', 1 while that catch-up goes on (its
-- subscriber's process continues it with topic_catchup.lua) else 0, the tail (includes/dispatch.lua
-- dispatch.add_tail)}, or
-- {'elsewhere', uri} when the durable key is registered on another topic (nothing changed: topic_ops
-- removes that one with topic_admin 'release' and tries again), or {'catchup'} when the durable
-- subscription's catch-up is still under way (nothing changed: the caller finishes it and tries again).
-- A durable key's registry entry (<ns>:durables, topic.registry) is written here, in the same step as
-- the subscription, so a crash can never leave one without the other.
--@include base
--@include dispatch
--@include topic
--@allow-oom
base.NOW = tonumber(ARGV[1])
local missing = base.require_destination()
if missing then return missing end
local cid, packed, lease_ms, requested = ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local key, sub_packed, retroactive = ARGV[7], ARGV[8], ARGV[9] == '1'
local client, name = ARGV[10], ARGV[11]
local reg_field, uri = ARGV[12], ARGV[13]
local sub_def = cmsgpack.unpack(sub_packed)
local durable = sub_def.durable == true

if redis.call('HEXISTS', base.TP .. ':subof', cid) == 1 then
  return base.fail('CONSUMER_EXISTS', 'consumer ' .. cid .. ' is already registered on this destination')
end
local state = 'existing'
local existing = redis.call('HGET', base.TP .. ':subs', key)
if existing and not durable then
  return base.fail('CONSUMER_EXISTS', 'consumer ' .. cid .. ' is already registered on this destination')
end
if durable then
  -- One durable key, one topic (§7.4): registered elsewhere, that subscription must go first.
  local where = redis.call('HGET', topic.registry, reg_field)
  if where and where ~= uri then return { 'elsewhere', where } end
end
if existing then
  topic.switch(key)
  if (redis.call('HGET', base.K_META, 'active') or '') ~= '' then
    return base.fail('DURABLE_IN_USE', 'Durable consumer is in use for client: ' .. client ..
                ' and subscriptionName: ' .. name)
  end
  -- its last consumer, under this id, still has messages being returned: the caller returns them
  -- (return_owed.lua) and asks again (consumer_add.lua does the same)
  if redis.call('HEXISTS', base.P .. ':closing', cid) == 1 then return { 'closing' } end
  -- made retroactive, it has not had all of its backlog yet (topic.catch_up): that comes first
  if redis.call('HEXISTS', base.K_META, 'catchup') == 1 then return { 'catchup' } end
  local old = cmsgpack.unpack(existing)
  -- (a STOMP selector is kept with ActiveMQ's `convert_string_expressions:` prefix, as its ConsumerInfo
  -- holds it; one stored without, before the prefix was kept, is the same selector)
  local function same_selector(a, b)
    local prefix = '^convert_string_expressions:'
    return string.gsub(a or '', prefix, '') == string.gsub(b or '', prefix, '')
  end
  if not same_selector(old.selector_text, sub_def.selector_text) or (old.nolocal == true) ~= (sub_def.nolocal == true) then
    lifecycle.remove_subscription('changed')  -- TopicRegion.hasDurableSubChanged: a new subscription replaces it
    existing = nil
    state = 'changed'
  else
    -- Back (DurableTopicSubscription.activate): the subscription takes its new consumer's info, the
    -- connection noLocal compares publishers with, the priority the priority policy sorts by (and the
    -- same selector as compiled by this version of the parser), and keeps its place among the topic's
    -- subscriptions (Topic.activate) and the moment it was made (`since`).
    sub_def.since = old.since
    local renewed = cmsgpack.pack(sub_def)
    if renewed ~= existing then
      redis.call('HSET', base.TP .. ':subs', key, renewed)
      if (tonumber(old.priority) or 0) ~= (tonumber(sub_def.priority) or 0) then topic.index_move(key, sub_def) end
    end
  end
  topic.switch(nil)
end
if durable then redis.call('HSET', topic.registry, reg_field, uri) end
-- a pattern's pseudo-topic (a wildcard subscription) joins <ns>:wildcards with the subscription, so the
-- next send to a matching topic, from any process, copies to it (includes/wildcard.lua)
wildcard.mark(true)
if not existing then
  if state ~= 'changed' then state = 'new' end
  -- `since`: the topic's last message sequence when it is made: a fan-out still going to the subscriptions
  -- of an earlier send passes it by (fanout.visit), as it does one that a key made again replaced
  local since = tonumber(redis.call('HGET', base.TP .. ':meta', 'seq') or 0)
  sub_def.since = since
  redis.call('HSET', base.TP .. ':subs', key, cmsgpack.pack(sub_def))
  redis.call('RPUSH', base.TP .. ':sorder', key)
  topic.index_add(key, sub_def)
  topic.switch(key)
  -- ('made': the topic's subscriptions made so far, this one's number: a key removed and made again is
  -- another subscription, told apart where a walk of :sorder stopped at it, topic.lua catch_up_unweighted)
  redis.call('HSET', base.K_META, 'uri', redis.call('HGET', base.TP .. ':meta', 'uri') or '', 'created', base.NOW,
             'made', redis.call('HINCRBY', base.TP .. ':meta', 'subs_made', 1),
             'replay_upto', since,
             'durable', durable and '1' or '0', 'client', client, 'name', name,
             'selector', sub_def.selector_text or '', 'nolocal', sub_def.nolocal and '1' or '0',
             'regfield', durable and reg_field or '')
  base.emit('subscription_add', 'durable', durable and 1 or 0, 'client', client, 'name', name,
       'selector', sub_def.selector_text or '')
else
  topic.switch(key)
end

-- The prefetch: the policy's value replaces the client default (§1.5); durable 100 (or 1000, the
-- optimize-acknowledge default), non-durable 32767.
local pol = topic.policy()
local prefetch = requested
if durable then
  if requested < 0 or requested == 100 or requested == 1000 then prefetch = tonumber(pol['durableTopicPrefetch']) end
elseif requested < 0 or requested == 32767 then
  prefetch = tonumber(pol['topicPrefetch'])
end

redis.call('HSET', base.K_CONSUMERS, cid, packed)
consumers.gmap.forget_priorities()
redis.call('HSET', base.K_C(cid), 'n', 0, 'ext', 0, 'groups', 0, 'dispatched', 0, 'acked', 0, 'added', base.NOW,
           'prefetch', prefetch)
redis.call('ZADD', base.K_LEASES, base.NOW + lease_ms, cid)
base.due_at(base.P, base.NOW + lease_ms + 1)  -- the reaper's visit when it lapses
redis.call('RPUSH', base.K_CORDER, cid)
redis.call('HSET', base.K_META, 'active', cid)
redis.call('HDEL', base.K_META, 'offline_since')
redis.call('HSET', base.TP .. ':subof', cid, key)
redis.call('HDEL', base.TP .. ':aborted', cid)  -- a reused id does not inherit an old abort notice
redis.call('ZREM', base.TP .. ':aborted:at', cid)
message.consumer_joined(cid)
local def = cmsgpack.unpack(packed)
base.emit('consumer_add', 'consumer', cid, 'priority', def.priority or 0, 'exclusive', 0, 'prefetch', prefetch,
     'selector', def.selector_text or '')
if durable and state == 'existing' then base.emit('subscription_online', 'consumer', cid) end

-- §7.5 retroactive consumers.
local recovered = 0
local catching_up = false
local replayed = nil
local s = { key = key, def = sub_def }
-- Whether this attachment replays the recovery policy, for the subscription listing (topic_ops): the
-- consumer asked for it, or (non-durable only, §7.5) the topic is alwaysRetroactive.
redis.call('HSET', base.K_META, 'retroactive', (retroactive or (not durable and (pol['alwaysRetroactive'] == '1'
  or pol['alwaysRetroactive'] == 'true'))) and '1' or '0')
if durable then
  if retroactive and state ~= 'existing' then
    -- A new subscription first catches up on what is stored for other durable subscriptions (Topic.activate
    -- loads the store's backlog); then the wrapped recovery policy runs only if that left nothing pending
    -- (DurableTopicSubscription.activate, §7.5); the retained message always. In bounded slices, the
    -- first here (includes/topic.lua topic.catch_up).
    topic.catch_up_begin()
    local done
    done, recovered = topic.catch_up(s, tonumber(ARGV[14]))
    catching_up = not done
  elseif retroactive then
    local empty = redis.call('ZCARD', base.K_PENDING) == 0 and redis.call('HLEN', base.K_INFLIGHT) == 0
      and redis.call('ZCARD', base.K_PARKED) == 0
    -- What the buffer may still give this subscription (meta 'replay_upto', a topic sequence): at first
    -- what was sent before it was made, as it had every later message when that was sent; once it has
    -- been offered the buffer, nothing (-1), so a message it acknowledged is not delivered again.
    local upto = tonumber(redis.call('HGET', base.K_META, 'replay_upto'))
    recovered = topic.replay(s, topic.recovery_items(empty, upto))
    if empty then redis.call('HSET', base.K_META, 'replay_upto', -1) end
  end
elseif (retroactive or pol['alwaysRetroactive'] == '1' or pol['alwaysRetroactive'] == 'true')
       and not wildcard.is_pattern(select(2, wildcard.topic_name())) then
  -- a pattern's pseudo-topic keeps no recovery buffer (topic_send.lua); topic_ops refuses `retroactive`
  -- on a wildcard, and alwaysRetroactive has nothing to replay there
  replayed = {}
  recovered = topic.replay(s, topic.recovery_items(true), replayed)
end

local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
-- Recovered messages reach a non-durable subscription as any other (TopicSubscription.add): its
-- pending-message limit applies to them.
if replayed and #replayed > 0 then topic.after_send(replayed, s) end
-- Dead letters of evicted replays (and advisories) wait in the topic's :fwd; flag 2 has them delivered now.
return dispatch.add_tail({ prefetch, recovered, state, catching_up and 1 or 0 }, dispatched, forward.with_flag(more),
                         hold)
