-- Return the next `chunk` messages that closed consumers still hold (includes/lifecycle.lua return_owed),
-- oldest dispatch first, then run a dispatch chunk so they can go to other consumers at once. Driven by the
-- call that closed them, and by the maintenance tick when that process died between chunks.
-- ARGV: now, budget, chunk. Returns {owed (messages still owed; 0: none), the tail
-- (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
base.NOW = tonumber(ARGV[1])
local returned, owed = lifecycle.return_owed(tonumber(ARGV[3]))
local dispatched, more, hold = 0, 0, 0
if returned > 0 or owed == 0 then dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2])) end
return dispatch.add_tail({ owed, nil, nil, nil }, dispatched, more, hold)
