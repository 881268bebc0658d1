-- Messages per message group, for the console's groups view (read-only): the pending ones among the
-- first ARGV[2] in dispatch order, and the in-flight ones (at most ARGV[3] examined).
-- ARGV: now, pending budget, in-flight budget.
-- Returns {pending examined, all pending seen (0/1), in flight examined, all in flight seen (0/1),
-- then per group in order of first sight: group id, pending, in flight}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local unknown = base.unknown_destination()
if unknown then return unknown end
local pending_budget, inflight_budget = tonumber(ARGV[2]), tonumber(ARGV[3])
local pending, inflight, order = {}, {}, {}

local function count(id, into)
  local blob = redis.call('HGET', base.K_MSGS, id)
  if not blob then return end
  local g = message.unpack(blob)[message.GROUP]
  if not g or g == '' then return end
  if not pending[g] and not inflight[g] then order[#order + 1] = g end
  into[g] = (into[g] or 0) + 1
end

local ids = redis.call('ZRANGE', base.K_PENDING, 0, pending_budget - 1)
for _, id in ipairs(ids) do count(id, pending) end
for g in pairs(inflight) do pending[g] = pending[g] or 0 end
local all_pending = (#ids < pending_budget or redis.call('ZCARD', base.K_PENDING) == #ids) and 1 or 0

local examined, cursor = 0, '0'
repeat
  local page = redis.call('HSCAN', base.K_INFLIGHT, cursor, 'COUNT', 200)
  cursor = page[1]
  for i = 1, #page[2], 2 do
    examined = examined + 1
    count(page[2][i], inflight)
  end
until cursor == '0' or examined >= inflight_budget

local out = {#ids, all_pending, examined, cursor == '0' and 1 or 0}
for _, g in ipairs(order) do
  out[#out + 1] = g
  out[#out + 1] = pending[g] or 0
  out[#out + 1] = inflight[g] or 0
end
return out
