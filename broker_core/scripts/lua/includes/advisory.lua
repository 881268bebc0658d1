-- Advisory messages (spec §11; broker_core/advisory.py builds the messages and names the topics).
--
-- emit() hands every lifecycle event here. One that ActiveMQ advises about is recorded in the
-- destination's forwarding hash in the same atomic step, under '<advisory id>|<advisory topic>', and
-- operations.forward publishes it on the topic (a crash in between leaves the record for the maintenance
-- job; the topic drops an id it already has). Nothing is recorded for an advisory topic that does not
-- exist (nobody ever subscribed: ActiveMQ drops a topic message without subscriptions) nor about an
-- advisory topic itself. That existence check reads a key outside this destination's hash tag, like
-- flow.lua's broker-wide usage (docs/broker_core.md).
-- wildcard subscriptions, whose patterns count as existing advisory topics (below)
--@include wildcard
-- Its module table `advisory`. Per call: n, the advisories recorded (forward.lua's flag 2); flags and dest,
-- what read_flags and source read once.
local advisory = { n = 0, flags = nil, dest = nil, sources = false, EVENTS = false, FLAGS = false }
--@on-call
advisory.n, advisory.flags, advisory.dest = 0, nil, nil
--@on-call-end

-- Event type -> {advisory kind, the policy flag that gates it ('' = always)}.
advisory.EVENTS = {
  consumer_add = { 'Consumer', '' }, consumer_remove = { 'Consumer', '' },
  expire = { 'Expired', '' }, deadletter = { 'MessageDLQd', '' },
  -- gated for queues too: 5.17.2's queue dispatch never advises a full subscription itself (5.17.3's
  -- AMQ-9153 does, ungated); its slow mark goes through BaseDestination.slowConsumer, which checks the flag
  slow = { 'SlowConsumer', 'advisoryForSlowConsumers' },
  full = { 'FULL', 'advisoryWhenFull' },
  evict = { 'MessageDiscarded', 'advisoryForDiscardingMessages' },
  enqueue = { 'MessageDelivered', 'advisoryForDelivery' },
  ack = { 'MessageConsumed', 'advisoryForConsumed' },
  dispatch = { 'MessageDispatched', 'advisoryForDispatched' },
}
advisory.FLAGS = { 'advisoryForSlowConsumers', 'advisoryWhenFull', 'advisoryForDiscardingMessages',
  'advisoryForDelivery', 'advisoryForConsumed', 'advisoryForDispatched', 'advisoryForFastProducers',
  'includeBodyForAdvisory', 'sendAdvisoryIfNoConsumers' }

-- The policy's advisory flags (from the policy values every script reads once, base.lua).
-- They are derived from the policy values alone, so they are kept in that table (under the key
-- advisory.FLAGS, which no policy name can be): decoded once per packed policy (base.lua), not per call.
function advisory.read_flags()
  if not advisory.flags then
    local values = base.POLICY_READ.values or base.policy()
    local flags = values[advisory.FLAGS]
    if not flags then
      flags = {}
      for _, flag in ipairs(advisory.FLAGS) do flags[flag] = base.policy_flag(flag) end
      -- the event types advisory.advise may record for (under the key advisory.EVENTS, no flag's name):
      -- base.emit calls it for those only, once the flags are read (the rest return at its gate)
      local loud = {}
      for kind, spec in pairs(advisory.EVENTS) do
        if spec[2] == '' or flags[spec[2]] or (kind == 'full' and flags['advisoryForFastProducers']) then
          loud[kind] = true
        end
      end
      flags[advisory.EVENTS] = loud
      values[advisory.FLAGS] = flags
    end
    advisory.flags = flags
  end
  return advisory.flags
end

-- This destination as advisories name it, read once per script call; false for an advisory topic.
-- What it makes of a prefix and its uri is kept (advisory.sources, by prefix: bounded; across calls where
-- the library outlives one), as is what advisory.topic makes of it (src.topics): derived from the prefix and
-- the uri alone, so a changed uri is a miss, never stale.
advisory.sources = { n = 0, by_tp = {} }
function advisory.source()
  if advisory.dest == nil then
    local uri = redis.call('HGET', base.TP .. ':meta', 'uri') or ''
    local known = advisory.sources.by_tp[base.TP]
    if known and known.uri == uri then
      advisory.dest = known.dest
      return advisory.dest
    end
    local scheme, name = string.match(uri, '^(%a+)://(.*)$')
    -- nor about a wildcard subscription's pseudo-topic (its name is a pattern, not a destination)
    if not name or string.sub(name, 1, 18) == 'ActiveMQ.Advisory.' or wildcard.is_pattern(name) then
      advisory.dest = false
    else
      local ns = string.match(base.TP, '^(.-):{')
      advisory.dest = { uri = uri, name = name, type = scheme == 'topic' and 'Topic' or 'Queue', ns = ns,
                      tag = string.sub(base.TP, #ns + 3, -2), topics = {} }
    end
    local sources = advisory.sources
    if sources.n >= 1024 then sources.n, sources.by_tp = 0, {} end
    sources.n = sources.n + 1
    sources.by_tp[base.TP] = { uri = uri, dest = advisory.dest }
  end
  return advisory.dest
end

-- The advisory topic of `kind` about `src` when it exists, else nil.
function advisory.topic(kind, src)
  local names = src.topics[kind]
  if not names then
    local topic = 'ActiveMQ.Advisory.' .. kind .. '.' .. src.type .. '.' .. src.name
    names = { topic, src.ns .. ':{t:' .. topic .. '}:meta' }
    src.topics[kind] = names
  end
  -- a wildcard subscription on a pattern matching the advisory topic counts as its existence (and one
  -- that may match, while the registry's trie is built: wildcard.matching, nothing lost)
  if redis.call('EXISTS', names[2]) == 0 then
    local patterns = wildcard.matching(src.ns, names[1])
    if patterns and #patterns == 0 then return nil end
  end
  return names[1]
end

-- `record_id`, when given, is the id the advisory message gets (NoConsumer: the message's own id).
-- `topic`: advisory.topic(kind, src) when the caller has asked already.
function advisory.record(kind, src, event, id, blob, record_id, topic)
  topic = topic or advisory.topic(kind, src)
  if not topic then return end
  if blob == nil then
    blob = id and redis.call('HGET', base.TP .. ':msgs', id) or ''
    if not blob then blob = '' end
  end
  local seq = redis.call('HINCRBY', base.TP .. ':meta', 'fwdseq', 1)  -- orders the destination's forwards
  -- the id's number is broker-wide (<ns>:advseq), not the destination's fwdseq, which a deleted
  -- and recreated destination starts again: the advisory topic's duplicate audit would drop its advisories.
  local advisory_id = record_id or 'ID:advisory:' .. src.tag .. ':' .. redis.call('INCR', src.ns .. ':advseq')
  event.advisory = kind
  redis.call('HSET', base.TP .. ':fwd', advisory_id .. '|topic://' .. topic,
             cmsgpack.pack({ 'topic://' .. topic, 'advisory', cmsgpack.pack(event), blob, seq }))
  base.due_at(base.TP, base.NOW)
  advisory.n = advisory.n + 1
end

-- Called by emit() with the event's type and fields. `blob`, when the caller gave one (base.lua
-- emit_message), is the packed message the event is about (it may already be gone from K_MSGS, e.g. an
-- expired one); false: an event ActiveMQ advises nothing about (a non-durable topic subscription's
-- EXPIRED ack, lifecycle.lua expire_message).
function advisory.advise(kind, blob, ...)
  local spec = advisory.EVENTS[kind]
  if not spec or blob == false then return end
  local flags = advisory.read_flags()  -- gated events (most sends, dispatches, acks) stop here: one HMGET
  local gate = spec[2]
  local maybe = kind == 'full' and flags['advisoryForFastProducers']
  if gate ~= '' and not flags[gate] and not maybe then return end
  local src = advisory.source()
  if not src then return end
  local kinds = {}
  if gate == '' or flags[gate] then kinds[#kinds + 1] = spec[1] end
  if kind == 'full' and flags['advisoryForFastProducers'] then kinds[#kinds + 1] = 'FastProducer' end
  if #kinds == 0 then return end
  -- Most advisory topics do not exist (nobody subscribed): asked first, before the event is built.
  local topics = {}
  for i, name in ipairs(kinds) do topics[i] = advisory.topic(name, src) or false end
  if not topics[1] and not topics[2] then return end
  local flat = { ... }
  local fields = {}
  for i = 1, #flat - 1, 2 do fields[tostring(flat[i])] = tostring(flat[i + 1]) end
  if base.SUB then fields.sub = base.SUB end  -- a topic subscription's event (MessageDiscarded names it)
  if base.SUB and kind == 'evict' and not fields.consumer then
    -- MessageDiscarded's consumerId is the subscription's consumer, not its internal key
    local held_by = redis.call('HKEYS', base.K_CONSUMERS)
    if #held_by > 0 then fields.consumer = held_by[1] end
  end
  if kind == 'full' then  -- FULL names this destination's own usage (AdvisoryBroker.isFull)
    fields.mem = redis.call('HGET', base.TP .. ':meta', 'mem') or '0'
  end
  local event = { type = kind, uri = src.uri, fields = fields, ts = base.NOW,
                  body = flags['includeBodyForAdvisory'] and 1 or 0 }
  if kind == 'consumer_add' or kind == 'consumer_remove' then
    -- ConsumerCount as ActiveMQ counts it: on a topic, offline durable subscriptions too; on a queue, its
    -- open browsers (base.live_browsers)
    if src.type == 'Topic' then
      event.count = redis.call('HLEN', base.TP .. ':subs')
    else
      event.count = redis.call('HLEN', base.TP .. ':consumers') + base.live_browsers(base.TP)
    end
    -- the count after the removal (AdvisoryBroker.removeConsumer runs after it): a non-durable
    -- subscription ('c.<id>') is deleted right after this event (lifecycle.lua close_consumer).
    if kind == 'consumer_remove' and base.SUB and string.sub(base.SUB, 1, 2) == 'c.'
       and redis.call('HEXISTS', base.TP .. ':subs', base.SUB) == 1 then
      event.count = event.count - 1
    end
  end
  for i, name in ipairs(kinds) do
    if topics[i] then advisory.record(name, src, event, fields.msg, blob, nil, topics[i]) end
  end
end

-- BaseDestination.onMessageWithNoConsumers (spec §11), with the policy's sendAdvisoryIfNoConsumers: a
-- NON-persistent message that found no consumer is sent, as it is and under its own id, to
-- ActiveMQ.Advisory.NoConsumer.<T>.<name> (advisory.py `build` applies ActiveMQ's original-destination
-- rule). The send scripts call this for a message they accepted: a topic's when no subscription matched it
-- (Topic.dispatch: none, or none matching; it is then dropped), a queue's when the queue has no consumer at
-- all (Queue.messageSent: consumers.isEmpty(), whatever their selectors; the message is still enqueued).
-- Never about an advisory topic (advisory.source). `persistent` is the message's message.PERSISTENT value.
function advisory.no_consumer(id, blob, persistent)
  if persistent == true or persistent == 1 or not advisory.read_flags()['sendAdvisoryIfNoConsumers'] then return end
  local src = advisory.source()
  if not src then return end
  if src.type == 'Queue' and redis.call('HLEN', base.K_CONSUMERS) > 0 then return end
  advisory.record('NoConsumer', src, { type = 'no_consumer', uri = src.uri, fields = { msg = id }, ts = base.NOW },
            id, blob, id)
end
