-- Finish one forward (operations.forward; includes/forward.lua records them).
-- KEYS[1] = the source destination's prefix. ARGV: now, mode, record field, target meta key, charge, target,
-- reason.
-- mode 'done': runs in the same MULTI/EXEC as the target's send, so the copy is delivered and its record
-- removed in one atomic step: a crash leaves both or neither, and a copy is never delivered twice even
-- once it has left the target's duplicate audit window. A virtual destination's copy also stops counting
-- against its target's limit while on its way ('memfwd' in the target's meta, includes/virtual.lua).
-- mode 'refused': the target refused the copy for good: the record is gone (removed by
-- 'done' in the same MULTI); count and log it so that the message is accounted for, and forwarding goes on.
--@include base
base.NOW = tonumber(ARGV[1])
if ARGV[2] == 'done' then
  redis.call('HDEL', base.K_FWD, ARGV[3])
  local charge = tonumber(ARGV[5]) or 0
  if charge > 0 and ARGV[4] ~= '' and redis.call('HINCRBY', ARGV[4], 'memfwd', -charge) < 0 then
    redis.call('HSET', ARGV[4], 'memfwd', 0)  -- the target was deleted (its meta with it) meanwhile
  end
  return 1
end
base.meta_incr('forward_refused')
local id = string.match(ARGV[3], '^([^|]*)')
base.emit('forward_refused', 'msg', id, 'target', ARGV[6], 'reason', ARGV[7])
return 1
