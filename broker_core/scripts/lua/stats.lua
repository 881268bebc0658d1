-- A snapshot of a destination's counters and of its consumers (spec §14.2-14.4), the consumers a page a
-- call: nothing limits a queue's consumers, and reading each one's five keys took 104 ms of CPU at 5,000 in
-- one call (docs/benchmarks.md, "Session 32").
-- ARGV: now, page (the most consumers read in a call), a token naming this read's copy of the order; then
-- nothing (the first call) or 'consumers' and the index of the page in the copy (the calls after it).
-- The first call returns {meta hash flat, pending, in flight, groups, parked, forwarding,
-- consumers: per consumer id, definition, counters (flat), lease, undelivered (the first `page` of the
-- dispatch order), {memoryLimit, broker limit}, {events, audit size}, open browsers, the number of
-- consumers in the order when more than `page` (0 otherwise)}. Then the order is copied (COPY: the server
-- copies the list's nodes; the first call took 2.5-4.9 ms at 10,000 and at 50,000 consumers alike, where
-- returning the other ids took 6-9 and 17-20 ms), for the calls after it to read a page each, in the order
-- of the first call whatever the dispatch passes rotate meanwhile; the last page's call deletes the copy,
-- which lapses after COPY_MS if the reader stops.
-- A call after the first returns the consumers of its page still registered, as above.
--@include base
--@allow-oom
base.NOW = tonumber(ARGV[1])
local page = tonumber(ARGV[2])

-- `later`: a page after the first, which leaves out a consumer closed since the first call.
local function consumers_of(ids, later)
  local flat = {}
  for i = 1, #ids do
    local cid = ids[i]
    local packed = redis.call('HGET', base.K_CONSUMERS, cid)
    if packed or not later then
      flat[#flat + 1] = cid
      flat[#flat + 1] = packed or ''
      flat[#flat + 1] = redis.call('HGETALL', base.K_C(cid))
      flat[#flat + 1] = tostring(redis.call('ZSCORE', base.K_LEASES, cid) or '')
      flat[#flat + 1] = redis.call('LLEN', base.K_COUT(cid))
    end
  end
  return flat
end

local COPY_MS = 60000
local copy = base.P .. ':statsorder:' .. ARGV[3]

if ARGV[4] == 'consumers' then
  local from = tonumber(ARGV[5])
  local ids = redis.call('LRANGE', copy, from, from + page - 1)
  if from + page >= redis.call('LLEN', copy) then redis.call('DEL', copy) end
  return consumers_of(ids, true)
end

local out = {
  -- (in flight: with a consumer, or held for the transaction that acknowledged it, its consumer closed
  -- since: includes/lifecycle.lua txheld_key)
  redis.call('HGETALL', base.K_META), redis.call('ZCARD', base.K_PENDING),
  redis.call('HLEN', base.K_INFLIGHT) + redis.call('ZCARD', base.P .. ':txheld'),
  redis.call('HLEN', base.K_GROUPS), redis.call('ZCARD', base.K_PARKED), redis.call('HLEN', base.K_FWD),
}
local first = redis.call('LRANGE', base.K_CORDER, 0, page - 1)
out[#out + 1] = consumers_of(first, false)
-- the limits in force for memory usage (includes/flow.lua): memoryLimit, and the broker's limit.
out[#out + 1] = { redis.call('HGET', base.K_POLICY, 'memoryLimit') or '0', redis.call('HGET', flow.usage, 'limit') or '' }
-- the bounded structures beside the messages: the events the event stream holds (its entries and what its
-- packed entries hold beyond one each, in the owner's meta: base.end_call), the duplicate audit's size
out[#out + 1] = { redis.call('XLEN', base.K_EVENTS) + (tonumber(redis.call('HGET', base.TP .. ':meta', 'events_extra')) or 0),
                  redis.call('ZCARD', base.K_AUDIT) }
-- the queue's open browsers (includes/base.lua live_browsers): consumers in its ConsumerCount
out[#out + 1] = base.live_browsers()
local count = #first < page and 0 or redis.call('LLEN', base.K_CORDER)
if count > page then
  redis.call('COPY', base.K_CORDER, copy, 'REPLACE')
  redis.call('PEXPIRE', copy, COPY_MS)
else
  count = 0
end
out[#out + 1] = count
return out
