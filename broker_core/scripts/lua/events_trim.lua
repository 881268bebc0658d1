-- Drop the entries of the destination's event stream with ids below ARGV[1] (a stream id), at most ARGV[2]
-- of them: the event archive's trim of what it archived (broker_core/event_archive.py), in bounded steps.
-- Returns {entries dropped, events they held}; fewer entries than ARGV[2] when none below is left.
--@include base
--@allow-oom
local entries, events = base.drop_events(base.K_EVENTS, base.TP .. ':meta', tonumber(ARGV[2]), ARGV[1], nil)
return { entries, events }
