-- Go on with a topic's unfinished fan-outs (includes/fanout.lua): match the queued messages against the
-- subscriptions still to visit, oldest message first, until a call's worth of selector work; the
-- subscriptions that take them get them and run a dispatch chunk, as in topic_send.lua. Driven by the
-- sender after a send that left its fan-out unfinished, and by the maintenance tick's recovery when the
-- sender died.
-- KEYS[1] = the topic's prefix. ARGV: now, budget.
-- Returns {fan-outs finished in this call, fan-outs still unfinished, the tail (includes/dispatch.lua
-- dispatch.add_tail, with the subscription keys whose pass has more)}.
--@include base
--@include topic
--@include fanout
base.NOW = tonumber(ARGV[1])
local missing = base.require_destination()
if missing then return missing end
local touched, order = {}, {}
local finished = fanout.run(touched, order)
local dispatched, flags, hold, more_keys = topic.deliver(touched, order, tonumber(ARGV[2]))
flags = forward.with_flag(flags)
return dispatch.add_tail({ finished, redis.call('LLEN', base.TP .. ':fanout'), nil, nil, nil }, dispatched, flags, hold, more_keys)
