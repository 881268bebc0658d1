-- a transaction's commit or rollback gives back the space its sends reserved (includes/flow.lua).
-- KEYS[1] = the destination's prefix; at a commit, KEYS[2] = the transaction's key (a step of its commit:
-- includes/base.lua begin_call). ARGV: now, transaction id. Runs in the commit's MULTI/EXEC, so the
-- reservation ends in the same atomic step as the committed messages start counting.
--@include base
--@allow-oom
local P = KEYS[1]
local TP = string.match(P, '^(.-}):s:') or P
flow.reservation_end(TP .. ':memres', ARGV[2])
flow.reservation_end(flow.usage_res, ARGV[2] .. '|' .. TP)
return 1
