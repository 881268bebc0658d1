-- Close consumers whose lease ran out (crashed gateway process, abandoned HTTP consumer).
-- ARGV: now, budget, max consumers. Returns {closed ids..., '', dispatched, more, hold_until}.
--@include base
--@include dispatch
--@allow-oom
NOW = tonumber(ARGV[1])
local out = {}
for _, cid in ipairs(redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', '(' .. NOW, 'LIMIT', 0, tonumber(ARGV[3]))) do
  if close_consumer(cid, 'lease_expired') then out[#out + 1] = cid end
end
local dispatched, more, hold = 0, 0, 0
if #out > 0 then dispatched, more, hold = dispatch_chunk(tonumber(ARGV[2])) end
out[#out + 1] = ''
out[#out + 1] = dispatched
out[#out + 1] = more
out[#out + 1] = hold
return out
