-- Run one bounded chunk of the dispatch pass. ARGV: now, budget (0 = the policy's maxPageSize).
-- Returns {dispatched, more, hold_until}.
--@include base
--@include dispatch
--@allow-oom
NOW = tonumber(ARGV[1])
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return {dispatched, more, hold}
