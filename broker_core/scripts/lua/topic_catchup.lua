-- Go on with a new retroactive durable subscription's catch-up on the topic's backlog: one bounded slice
-- (includes/topic.lua topic.catch_up), and a dispatch chunk once it is done. Its subscriber's process
-- calls this until it is (topics.catch_up), the maintenance tick should that process die; two drivers at
-- once are safe (each call goes on from the cursor the last one left).
-- KEYS[1] = the topic's prefix. ARGV: now, budget, subscription key, stored messages to examine at most (as
-- topic_subscribe's).
-- Returns {1 while the catch-up goes on else 0, messages replayed}, then the tail (dispatch.add_tail).
-- A subscription gone meanwhile (its catch-up with it): {0, 0}.
--@include base
--@include dispatch
--@include topic
--@allow-oom
base.NOW = tonumber(ARGV[1])
local missing = base.require_destination()
if missing then return missing end
local key = ARGV[3]
local def = redis.call('HGET', base.TP .. ':subs', key)
if not def then return dispatch.add_tail({ 0, 0 }, 0, 0, 0) end
topic.switch(key)
local done, got = topic.catch_up({ key = key, def = cmsgpack.unpack(def) }, tonumber(ARGV[4]))
local dispatched, more, hold = 0, 0, 0
if done then dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2])) end
return dispatch.add_tail({ done and 0 or 1, got }, dispatched, forward.with_flag(more), hold)
