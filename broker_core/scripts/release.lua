-- Return in-flight messages of a consumer to the destination at once, redelivery counter raised
-- (transaction rollback, session recover). ARGV: now, budget, consumer id, message ids...
-- Returns {returned count, dispatched, more, hold_until}.
--@include base
--@include dispatch
NOW = tonumber(ARGV[1])
local cid = ARGV[3]
if redis.call('HEXISTS', K_CONSUMERS, cid) == 0 then
  return fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination')
end
for i = 4, #ARGV do
  if not redis.call('ZSCORE', K_CINF(cid), ARGV[i]) then
    return fail('NOT_IN_FLIGHT', 'message ' .. ARGV[i] .. ' is not in flight with consumer ' .. cid)
  end
end
local rcv = received_upto(cid)
for i = 4, #ARGV do
  local received = tonumber(redis.call('ZSCORE', K_CINF(cid), ARGV[i])) <= rcv
  if not received then redis.call('LREM', K_COUT(cid), 1, ARGV[i]) end
  return_message(cid, ARGV[i], received, 'rollback')
end
local dispatched, more, hold = dispatch_chunk(tonumber(ARGV[2]))
return {#ARGV - 3, dispatched, more, hold}
