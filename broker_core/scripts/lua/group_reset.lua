-- removeMessageGroup(name) / removeAllMessageGroups() (spec §3.5): later messages are re-assigned;
-- in-flight messages stay where they are. ARGV: now, budget, group id ('' with ARGV[4] = 'all' for every
-- group). Returns {removed count, the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local removed = 0
if ARGV[4] == 'all' then
  removed = redis.call('HLEN', base.K_GROUPS)
  local reset_counts = groups.map_type() == 'cached'  -- only the cached map resets assigned counts
  if reset_counts then consumers.unordered() end  -- (includes/consumers.lua join_order)
  -- UNLINK, not DEL: the keys leave at once and Redis frees a large one in its background thread, so the
  -- call costs the same with 50,000 groups as with 5 (DEL frees each group here).
  for _, cid in ipairs(redis.call('HKEYS', base.K_CONSUMERS)) do
    redis.call('UNLINK', base.K_CGRP(cid))
    if reset_counts then redis.call('HSET', base.K_C(cid), 'groups', 0) end
  end
  redis.call('UNLINK', base.K_GROUPS)
  if groups.map_type() == 'cached' then redis.call('UNLINK', base.K_GLRU) end
  base.emit('group_reset', 'group', '*', 'removed', removed)
else
  local slot = groups.slot(ARGV[3])
  if groups.remove_slot(slot) then
    removed = 1
    if groups.map_type() == 'bucket' then redis.call('ZREM', base.K_GLRU, ARGV[3]) end
  end
  base.emit('group_reset', 'group', ARGV[3], 'removed', removed)
end
message.reset_pass()
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ removed, nil, nil, nil }, dispatched, more, hold)
