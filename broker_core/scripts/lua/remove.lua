-- Remove messages by id (QueueView.removeMessage, spec §14.3; a purge is purge.lua). Counted as purged.
-- ARGV: now, budget, '1' to remove scheduled ones alone (jobs and delayed messages not yet due: ActiveMQ's
-- scheduler management removes from its job store, never a message that has arrived) or '0', ids...
-- Returns {removed count, left (pending + in flight + parked), the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local unknown = base.unknown_destination()
if unknown then return unknown end
local removed = 0
local function remove(id)
  if ARGV[3] == '1'
     and not select(2, lifecycle.parked_score(redis.call('HGET', base.K_PARKINFO, id) or '')) then
    return
  end
  local blob, scheduled = operator.take_out(id)  -- (not on the queue yet: cancelled, not purged)
  if scheduled then
    removed = removed + 1
    base.meta_incr('cancelled')
    base.emit('cancel', 'msg', id)
  elseif blob then
    removed = removed + 1
    base.meta_incr('purged')
    base.meta_incr('dequeued')
  end
end
for i = 4, #ARGV do remove(ARGV[i]) end
if removed > 0 then base.emit('remove', 'msg', ARGV[4], 'count', removed) end
message.reset_pass()
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
local left = redis.call('ZCARD', base.K_PENDING) + redis.call('HLEN', base.K_INFLIGHT) + redis.call('ZCARD', base.K_PARKED)
return dispatch.add_tail({ removed, left, nil, nil, nil }, dispatched, more, hold)
