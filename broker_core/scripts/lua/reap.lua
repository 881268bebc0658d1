-- Close consumers whose lease ran out (crashed gateway process, abandoned HTTP consumer).
-- Between them they return at most `chunk` of the messages they hold; the rest are owed (return_owed.lua).
-- With room left in `chunk`, messages held for transactions that lapsed go back too.
-- ARGV: now, budget, max consumers, chunk. Returns {closed ids..., owed, the tail
-- (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local out = {}
local chunk, owed = tonumber(ARGV[4]), 0
for _, cid in ipairs(redis.call('ZRANGEBYSCORE', base.K_LEASES, '-inf', '(' .. base.NOW, 'LIMIT', 0, tonumber(ARGV[3]))) do
  local held = redis.call('ZCARD', base.K_CINF(cid))
  local closed, left = lifecycle.close_consumer(cid, 'lease_expired', chunk)
  if closed then
    out[#out + 1] = cid
    chunk = math.max(chunk - (held - left), 0)
    owed = owed + left
  end
end
-- Messages held for transactions that lapsed with their owner (includes/lifecycle.lua return_lapsed): a
-- process that died held both the consumer and the transaction, and the live processes that reap its
-- consumers give those back too (the maintenance tick does it as well)
local back = 0
if chunk > 0 then
  local due
  back, due = lifecycle.return_lapsed(chunk)
  owed = owed + due
end
local dispatched, more, hold = 0, 0, 0
if #out > 0 or back > 0 then dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2])) end
out[#out + 1] = owed
dispatch.add_tail(out, dispatched, more, hold)
return out
