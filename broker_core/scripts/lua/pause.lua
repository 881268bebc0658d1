-- Pause or resume dispatch (QueueView.pause/resume). ARGV: now, budget, '1' to pause or '0' to resume.
-- Returns {the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
redis.call('HSET', base.K_META, 'paused', ARGV[3])
base.emit(ARGV[3] == '1' and 'pause' or 'resume')
if ARGV[3] == '1' then return dispatch.add_tail({ nil, nil, nil }, 0, 0, 0) end
message.mark_dirty()
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ nil, nil, nil }, dispatched, more, hold)
