-- The main counters of one or many topics, as topic_ops.stats adds them up (the console's index and the
-- metrics scrape: `summary_many` is the queues' counterpart), without reading each subscription in full.
-- KEYS: the topics' prefixes. ARGV: now, start (where in the first topic's subscription list, :sorder, to
-- begin: 0, or the `next` a previous reply gave), budget (units of work at most: one per topic reached and
-- one per subscription read, so a call over a topic with thousands of subscriptions stays short).
-- Returns 15 values per topic reached, in KEYS order: exists (0/1), subscriptions (LLEN :sorder), next (0:
-- this topic is complete; else the index where its subscriptions continue, and no later topic follows),
-- pending, in flight, parked, enqueued, dequeued, dispatched, expired, deadlettered, bytes held (meta.mem),
-- the memory limit in force (the topic's memoryLimit, else the broker's; as summary_many.lua), and the
-- topic's message sizes and enqueue times (meta.msgsize, meta.enqtime, includes/message.lua size_note,
-- times_added; false when none).
-- The sums cover the subscriptions read; the first part of a topic (start 0) also carries the topic's own
-- counts and those its ended subscriptions left (ended_*, evict_dequeued). Topics past the budget are not
-- in the reply: the caller asks again from the first one missing.
--@include base
--@include flow
--@allow-oom
local start = tonumber(ARGV[2])
local budget = tonumber(ARGV[3])
local TOPIC_FIELDS = { 'uri', 'enqueued', 'expired', 'deadlettered', 'mem', 'ended_pending', 'ended_in_flight',
  'ended_parked', 'ended_dequeued', 'ended_dispatched', 'ended_expired', 'ended_deadlettered',
  'evict_dequeued', 'msgsize', 'enqtime' }
local out = {}
local broker_limit = KEYS[1] and tonumber(redis.call('HGET', string.match(KEYS[1], '^(.-):{') .. ':usage',
  'limit')) or flow.BROKER_DEFAULT_LIMIT
for i, prefix in ipairs(KEYS) do
  if budget <= 0 then break end
  budget = budget - 1
  local from = i == 1 and start or 0
  local m = redis.call('HMGET', prefix .. ':meta', unpack(TOPIC_FIELDS))
  local function n(j) return tonumber(m[j]) or 0 end
  local count = m[1] and redis.call('LLEN', prefix .. ':sorder') or 0
  local pending, in_flight, parked, dequeued, dispatched, expired, dead = 0, 0, 0, 0, 0, 0, 0
  if m[1] and from == 0 then
    -- (parked: the topic's own scheduled messages too, kept on it until they fire, topic_send.lua)
    pending, in_flight, parked = n(6), n(7), n(8) + redis.call('ZCARD', prefix .. ':parked')
    dequeued, dispatched = n(9) + n(13), n(10)
    expired, dead = n(3) + n(11), n(4) + n(12)
  end
  local upto = math.min(count, from + math.max(budget, 1)) - 1  -- (at least one: every call makes progress)
  if upto >= from then
    for _, key in ipairs(redis.call('LRANGE', prefix .. ':sorder', from, upto)) do
      -- the few keys read here, named here (base.lua's names for a subscription's prefix)
      local sub = prefix .. ':s:' .. key
      local c = redis.call('HMGET', sub .. ':meta', 'dequeued', 'dispatched', 'expired', 'deadlettered')
      pending = pending + redis.call('ZCARD', sub .. ':pending')
      -- (and those held for a transaction, their consumer gone: includes/lifecycle.lua txheld_key)
      in_flight = in_flight + redis.call('HLEN', sub .. ':inflight') + redis.call('ZCARD', sub .. ':txheld')
      parked = parked + redis.call('ZCARD', sub .. ':parked')
      dequeued = dequeued + (tonumber(c[1]) or 0)
      dispatched = dispatched + (tonumber(c[2]) or 0)
      expired = expired + (tonumber(c[3]) or 0)
      dead = dead + (tonumber(c[4]) or 0)
    end
    budget = budget - (upto - from + 1)
  end
  local following = (upto + 1 < count) and upto + 1 or 0
  out[#out + 1] = m[1] and 1 or 0
  out[#out + 1] = count
  out[#out + 1] = following
  out[#out + 1] = pending
  out[#out + 1] = in_flight
  out[#out + 1] = parked
  out[#out + 1] = n(2)
  out[#out + 1] = dequeued
  out[#out + 1] = dispatched
  out[#out + 1] = expired
  out[#out + 1] = dead
  out[#out + 1] = n(5)
  local own = tonumber(redis.call('HGET', prefix .. ':policy', 'memoryLimit')) or 0
  out[#out + 1] = own > 0 and own or broker_limit
  out[#out + 1] = m[14] or false
  out[#out + 1] = m[15] or false
  if following ~= 0 then break end
end
return out
