-- The main counters of one or many queues (the console's index and the metrics scrape of 10,000
-- destinations: one call per page instead of one pipelined call per queue, whose client-side cost
-- dominated). KEYS: the queues' prefixes. A Redis Cluster refuses a call over several slots (CROSSSLOT);
-- the caller then calls it per queue. ARGV: now, oldest (1: also look up the oldest pending message,
-- up to 10 more lookups per queue; the metrics scrape asks, the console's index does not).
-- Returns per queue 17 values: exists (0/1), pending, in flight, parked, groups, consumers (open browsers
-- too), the meta
-- counters enqueued, dequeued, dispatched, expired, deadlettered, paused (false when unset), bytes held
-- (meta.mem), the timestamp of the oldest pending message (its arrival for a JMSTimestamp of 0 or one
-- after it; false when none or not asked; -1 when
-- unknown: reading it would pass the call's OLDEST_BYTES), the memory limit in force (its policy's
-- memoryLimit, else the broker's: MemoryLimit of ActiveMQ's queue MBean; read across hash tags, as
-- includes/flow.lua reads the broker's usage), and the message sizes (meta.msgsize, includes/message.lua
-- size_note; false when none) and enqueue times (meta.enqtime, message.lua times_added; false when none).
--@include base
--@include message
--@include flow
--@allow-oom
base.NOW = tonumber(ARGV[1])
local want_oldest = ARGV[2] == '1'

-- Scores are the broker sequence (a returned message's minus 2^45), or with prioritizedMessages
-- (9 - priority) * 2^44 + sequence (message.lua pending_score): each band is in sending order, so the
-- oldest pending message is the head of one of the bands. At most 10 lookups, O(log n) each.
local BAND = 17592186044416  -- 2^44
-- The timestamp is inside the message's blob, which HGET copies whole into the script: a 4 MiB message
-- costs ~25 ms, and 50 queues headed by one cost over a second. So a call reads at most OLDEST_BYTES of
-- blobs (HSTRLEN first, O(1)); a queue whose lookup would pass that gets -1 (unknown).
local OLDEST_BYTES = 1048576
local read_bytes = 0
local function oldest_pending_timestamp(pending_key, msgs_key)
  local head = redis.call('ZRANGE', pending_key, 0, 0, 'WITHSCORES')
  local oldest = false
  while head[1] do
    local size = redis.call('HSTRLEN', msgs_key, head[1])
    if read_bytes + size > OLDEST_BYTES then return -1 end
    read_bytes = read_bytes + size
    local blob = redis.call('HGET', msgs_key, head[1])
    -- the timestamp is the 4th element of the packed array (message.lua), read without the rest
    if blob and string.byte(blob, 1) == 0xdc then
      local _, _, _, _, ts = cmsgpack.unpack_limit(blob, 4, 3)
      ts = tonumber(ts)
      -- Its age counts from when it got here when the timestamp says nothing of that: JMSTimestamp 0 is
      -- JMS's "none given" (a producer's disableMessageTimestamp, STOMP's timestamp:0), not 1970; one after
      -- its arrival is a producer's clock running ahead. Read as they are, both showed a stuck queue as 0.
      local arrived = message.arrived(blob)
      if ts == 0 or (arrived and ts and ts > arrived) then ts = arrived end
      if ts and (not oldest or ts < oldest) then oldest = ts end
    end
    local score = tonumber(head[2])  -- (returned messages without priority: the band below 0)
    local next_band = (math.floor(score / BAND) + 1) * BAND
    head = redis.call('ZRANGEBYSCORE', pending_key, next_band, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  end
  return oldest
end

local out = {}
local broker_limit = KEYS[1] and tonumber(redis.call('HGET', string.match(KEYS[1], '^(.-):{') .. ':usage',
  'limit')) or flow.BROKER_DEFAULT_LIMIT
for _, prefix in ipairs(KEYS) do
  -- the few keys read here, named here (base.lua's names for a queue): use_prefix would build all 19
  -- names of every queue, half of this script's time
  local pending_key = prefix .. ':pending'
  local meta = redis.call('HMGET', prefix .. ':meta', 'uri', 'enqueued', 'dequeued', 'dispatched', 'expired',
                          'deadlettered', 'paused', 'mem', 'msgsize', 'enqtime')
  local pending = redis.call('ZCARD', pending_key)
  out[#out + 1] = meta[1] and 1 or 0
  out[#out + 1] = pending
  out[#out + 1] = redis.call('HLEN', prefix .. ':inflight') + redis.call('ZCARD', prefix .. ':txheld')
  out[#out + 1] = redis.call('ZCARD', prefix .. ':parked')
  out[#out + 1] = redis.call('HLEN', prefix .. ':groups')
  -- (with its open browsers, as ActiveMQ's ConsumerCount: includes/base.lua live_browsers)
  out[#out + 1] = redis.call('LLEN', prefix .. ':corder') + base.live_browsers(prefix)
  for i = 2, 8 do out[#out + 1] = meta[i] or false end
  out[#out + 1] = want_oldest and pending > 0 and oldest_pending_timestamp(pending_key, prefix .. ':msgs')
    or false
  local own = tonumber(redis.call('HGET', prefix .. ':policy', 'memoryLimit')) or 0
  out[#out + 1] = own > 0 and own or broker_limit
  out[#out + 1] = meta[9] or false
  out[#out + 1] = meta[10] or false
end
return out
