-- A destination's main counters, small and cheap (the console's index of 10,000 destinations sorts and
-- totals these; `stats` gives everything). ARGV: now.
-- Returns {exists (0/1), pending, in flight, parked, groups, consumers, then the meta counters
-- enqueued, dequeued, dispatched, expired, deadlettered, paused (false when unset)}.
--@include base
--@allow-oom
NOW = tonumber(ARGV[1])
local exists = redis.call('HEXISTS', K_META, 'uri')
local out = {
  exists, redis.call('ZCARD', K_PENDING), redis.call('HLEN', K_INFLIGHT), redis.call('ZCARD', K_PARKED),
  redis.call('HLEN', K_GROUPS), redis.call('LLEN', K_CORDER),
}
for _, v in ipairs(redis.call('HMGET', K_META, 'enqueued', 'dequeued', 'dispatched', 'expired', 'deadlettered',
                              'paused')) do
  out[#out + 1] = v
end
return out
