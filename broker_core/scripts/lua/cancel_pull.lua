-- A pull (prefetch 0) receive timed out: withdraw its request so nothing more is dispatched to it.
-- ARGV: now, consumer id.
--@include base
--@allow-oom
base.NOW = tonumber(ARGV[1])
if redis.call('HEXISTS', base.K_CONSUMERS, ARGV[2]) == 0 then
  return base.fail('UNKNOWN_CONSUMER', 'no consumer ' .. ARGV[2] .. ' on this destination')
end
redis.call('HSET', base.K_C(ARGV[2]), 'ext', 0)
return 1
