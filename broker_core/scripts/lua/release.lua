-- Return in-flight messages of a consumer to the destination at once, redelivery counter raised
-- (transaction rollback, session recover). ARGV: now, budget, consumer id, message ids...
-- Returns {returned count, the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local cid = ARGV[3]
if redis.call('HEXISTS', base.K_CONSUMERS, cid) == 0 then
  return base.fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination')
end
local ids, seqs = {}, {}
for i = 4, #ARGV do
  local seq = redis.call('ZSCORE', base.K_CINF(cid), ARGV[i])
  if not seq then
    return base.fail('NOT_IN_FLIGHT', 'message ' .. ARGV[i] .. ' is not in flight with consumer ' .. cid)
  end
  if not seqs[ARGV[i]] then ids[#ids + 1] = ARGV[i] end
  seqs[ARGV[i]] = tonumber(seq)
end
local rcv = outbox.received_upto(cid)
local held = {}
for _, id in ipairs(ids) do
  if seqs[id] > rcv then redis.call('LREM', base.K_COUT(cid), 1, id) end  -- never received: no bump
  local n = #held
  held[n + 1], held[n + 2] = id, seqs[id]
end
lifecycle.return_messages(cid, held, rcv, 'rollback')
-- The window opened by DELIVERED acks (a transaction's acks) closes again, never below zero.
local ext = tonumber(redis.call('HGET', base.K_C(cid), 'ext')) or 0
redis.call('HSET', base.K_C(cid), 'ext', math.max(0, ext - #ids))
message.room_freed(cid)
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ #ids, nil, nil, nil }, dispatched, more, hold)
