-- Close a consumer: exclusive owner recomputed, groups freed, it leaves dispatch; of its unacked messages
-- the first `chunk` go back now, the rest are owed (return_owed.lua), redispatch.
-- ARGV: now, budget, consumer id, reason, chunk. Returns {dispatched, more, hold_until, owed}.
--@include base
--@include dispatch
--@allow-oom
NOW = tonumber(ARGV[1])
local closed, owed = close_consumer(ARGV[3], ARGV[4], tonumber(ARGV[5]))
if not closed then
  return fail('UNKNOWN_CONSUMER', 'no consumer ' .. ARGV[3] .. ' on this destination')
end
local dispatched, more, hold = dispatch_chunk(tonumber(ARGV[2]))
return {dispatched, more, hold, owed}
