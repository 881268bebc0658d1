-- Run one bounded chunk of the dispatch pass. ARGV: now, budget (0 = the policy's maxPageSize).
-- Returns {the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ nil, nil, nil }, dispatched, more, hold)
