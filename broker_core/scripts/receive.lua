-- Hand the adapter the messages dispatched to a consumer, oldest first, and renew its lease.
-- A prefetch-0 consumer pulls: it asks for `max` messages (MessagePull), which a dispatch chunk fills.
-- In ack mode 'auto' the messages are acknowledged as they are handed over.
-- ARGV: now, budget, consumer id, max, lease ms (0: the consumer's own lease length).
-- Returns {dispatched, more, hold_until, then per message: id, packed message, redeliveries, group first}.
--@include base
--@include dispatch
--@allow-oom
NOW = tonumber(ARGV[1])
local cid, max = ARGV[3], tonumber(ARGV[4])
local c, lease_until = find_consumer(cid)
if not c then return fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination') end
local lease = tonumber(ARGV[5])
if lease <= 0 then lease = tonumber(c.def.lease) or 30000 end
renew_lease(cid, lease, lease_until)
local dispatched, more, hold = 0, 0, 0
local waiting = redis.call('LLEN', K_COUT(cid))
if waiting < max then
  if c.prefetch == 0 and c.ext < max - waiting then
    redis.call('HSET', K_C(cid), 'ext', max - waiting)
    room_freed(cid)
  end
  dispatched, more, hold = dispatch_chunk(tonumber(ARGV[2]))
end
local out = {dispatched, more, hold}
-- A dispatch chunk changes only a pull consumer's (prefetch 0) window: `c` is still current otherwise.
local _, freed = pop_outbox(c.prefetch > 0 and c or find_consumer(cid), max, out)
if freed then dispatch_more(out, tonumber(ARGV[2])) end
out[2] = with_forward_flag(out[2])  -- handing over may have expired messages
return out
