-- Close a consumer: exclusive owner recomputed, groups freed, it leaves dispatch; of its unacked messages
-- the first `chunk` go back now, the rest are owed (return_owed.lua), redispatch.
-- ARGV: now, budget, consumer id, reason, chunk, optionally `written`: the dispatch sequence of the last
-- message the adapter wrote, when it knows that messages handed over after it (pushed, outbox.lua push_*)
-- never reached its client: they go back as not received (no redelivery counter raised).
-- Returns {owed, the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local written = ARGV[6] and tonumber(ARGV[6])
if written and redis.call('HEXISTS', base.K_CONSUMERS, ARGV[3]) == 1 and outbox.received_upto(ARGV[3]) > written then
  redis.call('HSET', base.K_C(ARGV[3]), 'rcv', base.NOW_TEXT.num(written))
end
local closed, owed = lifecycle.close_consumer(ARGV[3], ARGV[4], tonumber(ARGV[5]))
if not closed then
  return base.fail('UNKNOWN_CONSUMER', 'no consumer ' .. ARGV[3] .. ' on this destination')
end
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ owed, nil, nil, nil }, dispatched, more, hold)
