-- Close a consumer: exclusive owner recomputed, groups freed, unacked messages returned, redispatch.
-- ARGV: now, budget, consumer id, reason. Returns {dispatched, more, hold_until}.
--@include base
--@include dispatch
--@allow-oom
NOW = tonumber(ARGV[1])
if not close_consumer(ARGV[3], ARGV[4]) then
  return fail('UNKNOWN_CONSUMER', 'no consumer ' .. ARGV[3] .. ' on this destination')
end
local dispatched, more, hold = dispatch_chunk(tonumber(ARGV[2]))
return {dispatched, more, hold}
