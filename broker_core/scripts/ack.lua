-- Acknowledge messages of one consumer (spec §5.1, Appendix A), then optionally hand over the next ones.
-- ARGV: now, budget, consumer id, mode, receive max (0 = none), message ids...
--   individual: exactly the listed messages (INDIVIDUAL ack; also STOMP client-individual);
--   cumulative: every message dispatched to this consumer up to and including the (single) listed one
--               (STANDARD ack of a CLIENT_ACKNOWLEDGE session; STOMP client mode);
--   delivered:  the listed messages reached the application; the prefetch window grows by their count.
-- Nothing changes unless every listed message is in flight with this consumer.
-- Returns {acked count, dispatched, more, hold_until, then received messages as receive.lua returns them}.
--@include base
--@include dispatch
NOW = tonumber(ARGV[1])
local cid, mode, receive_max = ARGV[3], ARGV[4], tonumber(ARGV[5])
local c = find_consumer(cid)
if not c then return fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination') end
c.kept = true  -- this script keeps `c` current (lifecycle.lua ack_messages)
if #ARGV < 6 then return fail('INVALID_ACK', 'no message id given') end
local rcv = c.rcv  -- received_upto(cid), read with the consumer
local seqs = { [ARGV[6]] = false }  -- (made with room for the first id: set just below)
for i = 6, #ARGV do
  local seq = redis.call('ZSCORE', K_CINF(cid), ARGV[i])
  if not seq then
    return fail('NOT_IN_FLIGHT', 'message ' .. ARGV[i] .. ' is not in flight with consumer ' .. cid)
  end
  seqs[ARGV[i]] = tonumber(seq)
end
local ids
if (mode == 'individual' or mode == 'delivered') and #ARGV == 6 then
  ids = { ARGV[6] }  -- one id: nothing to dedupe (no table for that; made at its size)
elseif mode == 'individual' or mode == 'delivered' then
  ids = {}
  local seen = {}
  for i = 6, #ARGV do
    if not seen[ARGV[i]] then ids[#ids + 1] = ARGV[i] end  -- an id named twice is acked once
    seen[ARGV[i]] = true
  end
elseif mode == 'cumulative' then
  if #ARGV ~= 6 then return fail('INVALID_ACK', 'a cumulative ack names exactly one message') end
  ids = redis.call('ZRANGEBYSCORE', K_CINF(cid), '-inf', seqs[ARGV[6]])
else
  return fail('INVALID_ACK', 'unknown ack mode ' .. mode .. ' (individual, cumulative or delivered)')
end
if mode == 'delivered' then
  for i = 1, #ids do
    local id = ids[i]
    if seqs[id] > rcv then
      return fail('NOT_DELIVERED', 'message ' .. id .. ' has not been received by consumer ' .. cid)
    end
  end
  if c.prefetch > 0 then c.ext = redis.call('HINCRBY', K_C(cid), 'ext', #ids) end  -- `c` stays current
  redis.call('HSET', K_C(cid), 'last_ack', NOW)  -- any ack is one (AbstractSubscription.acknowledge)
else
  for i = 1, #ids do  -- (numeric loops in this path: ipairs is a call into C per element)
    local id = ids[i]
    if (seqs[id] or 0) > rcv then redis.call('LREM', K_COUT(cid), 1, id) end  -- acked before received
  end
  ack_messages(c, ids)
end
room_freed(cid)
-- `c` is current (the acks kept it so): the dispatch chunk uses it rather than read it again (consumers.lua)
SLOW_RULE.known, SLOW_RULE.known_prefix = c, P
local dispatched, more, hold = dispatch_chunk(tonumber(ARGV[2]))
-- (room for one received message: a table that grows is rebuilt at each power of two)
local out = { #ids, dispatched, more, hold, nil, nil, nil, nil }
-- The acks kept `c` current; a dispatch chunk changes only a pull consumer's (prefetch 0) window.
if receive_max > 0 then pop_outbox(c.prefetch > 0 and c or find_consumer(cid), receive_max, out) end
out[3] = with_forward_flag(out[3])  -- handing over may have expired messages
return out
