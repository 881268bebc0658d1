-- A consistent snapshot of a destination's counters and of each consumer (spec §14.2-14.4).
-- ARGV: now. Returns {meta hash flat, pending, in flight, groups, parked, forwarding,
-- consumers: per consumer id, definition, counters (flat), lease, undelivered, {memoryLimit, broker limit},
-- {events, audit size}, open browsers}.
--@include base
--@allow-oom
base.NOW = tonumber(ARGV[1])
local out = {
  -- (in flight: with a consumer, or held for the transaction that acknowledged it, its consumer closed
  -- since: includes/lifecycle.lua txheld_key)
  redis.call('HGETALL', base.K_META), redis.call('ZCARD', base.K_PENDING),
  redis.call('HLEN', base.K_INFLIGHT) + redis.call('ZCARD', base.P .. ':txheld'),
  redis.call('HLEN', base.K_GROUPS), redis.call('ZCARD', base.K_PARKED), redis.call('HLEN', base.K_FWD),
}
local consumers = {}
for _, cid in ipairs(redis.call('LRANGE', base.K_CORDER, 0, -1)) do
  consumers[#consumers + 1] = cid
  consumers[#consumers + 1] = redis.call('HGET', base.K_CONSUMERS, cid) or ''
  consumers[#consumers + 1] = redis.call('HGETALL', base.K_C(cid))
  consumers[#consumers + 1] = tostring(redis.call('ZSCORE', base.K_LEASES, cid) or '')
  consumers[#consumers + 1] = redis.call('LLEN', base.K_COUT(cid))
end
out[#out + 1] = consumers
-- the limits in force for memory usage (includes/flow.lua): memoryLimit, and the broker's limit.
out[#out + 1] = { redis.call('HGET', base.K_POLICY, 'memoryLimit') or '0', redis.call('HGET', flow.usage, 'limit') or '' }
-- the bounded structures beside the messages: the events the event stream holds (its entries and what its
-- packed entries hold beyond one each, in the owner's meta: base.end_call), the duplicate audit's size
out[#out + 1] = { redis.call('XLEN', base.K_EVENTS) + (tonumber(redis.call('HGET', base.TP .. ':meta', 'events_extra')) or 0),
                  redis.call('ZCARD', base.K_AUDIT) }
-- the queue's open browsers (includes/base.lua live_browsers): consumers in its ConsumerCount
out[#out + 1] = base.live_browsers()
return out
