-- summary.lua for many queues in one call (the console's index of 10,000 destinations: one call per
-- 1,000 instead of 1,000 pipelined ones, whose client-side cost dominated). KEYS: the queues' prefixes.
-- A Redis Cluster refuses the call (CROSSSLOT); the caller then falls back to summary.lua per queue.
-- ARGV: now. Returns per queue the 12 values of summary.lua.
--@include base
--@allow-oom
NOW = tonumber(ARGV[1])
local out = {}
for _, prefix in ipairs(KEYS) do
  use_prefix(prefix)
  out[#out + 1] = redis.call('HEXISTS', K_META, 'uri')
  out[#out + 1] = redis.call('ZCARD', K_PENDING)
  out[#out + 1] = redis.call('HLEN', K_INFLIGHT)
  out[#out + 1] = redis.call('ZCARD', K_PARKED)
  out[#out + 1] = redis.call('HLEN', K_GROUPS)
  out[#out + 1] = redis.call('LLEN', K_CORDER)
  for _, v in ipairs(redis.call('HMGET', K_META, 'enqueued', 'dequeued', 'dispatched', 'expired',
                                'deadlettered', 'paused')) do
    out[#out + 1] = v or false
  end
end
return out
