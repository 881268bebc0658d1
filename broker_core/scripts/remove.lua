-- Remove messages (QueueView.removeMessage / purge, spec §14.3): by id, or up to ARGV[3] messages from
-- the destination (in-flight ones first, as ActiveMQ's purge takes those too, then pending from the
-- head, then parked). Counted as purged. ARGV: now, budget, max ('0' with ids), ids...
-- Returns {removed count, left (pending + in flight + parked), flags, next time}.
--@include base
--@include dispatch
--@allow-oom
NOW = tonumber(ARGV[1])
local unknown = unknown_destination()
if unknown then return unknown end
local removed = 0
local function remove(id)
  local blob, job = take_out(id)
  if job then
    removed = removed + 1
    meta_incr('cancelled')
    emit('cancel', 'msg', id)
  elseif blob then
    removed = removed + 1
    meta_incr('purged')
    meta_incr('dequeued')
  end
end
local max = tonumber(ARGV[3])
if max == 0 then
  for i = 4, #ARGV do remove(ARGV[i]) end
  if removed > 0 then emit('remove', 'msg', ARGV[4], 'count', removed) end
else
  local ids = {}
  local page = redis.call('HSCAN', K_INFLIGHT, 0, 'COUNT', max)[2]
  for i = 1, #page, 2 do
    if #ids >= max then break end
    ids[#ids + 1] = page[i]
  end
  if #ids < max then
    for _, id in ipairs(redis.call('ZRANGE', K_PENDING, 0, max - #ids - 1)) do ids[#ids + 1] = id end
  end
  if #ids < max then
    for _, id in ipairs(redis.call('ZRANGE', K_PARKED, 0, max - #ids - 1)) do ids[#ids + 1] = id end
  end
  for _, id in ipairs(ids) do remove(id) end
  if removed > 0 then emit('purge', 'count', removed) end
end
reset_pass()
local dispatched, more, hold = dispatch_chunk(tonumber(ARGV[2]))
local left = redis.call('ZCARD', K_PENDING) + redis.call('HLEN', K_INFLIGHT) + redis.call('ZCARD', K_PARKED)
return {removed, left, more, hold}
