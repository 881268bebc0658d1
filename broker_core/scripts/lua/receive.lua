-- Hand the adapter the messages dispatched to a consumer, oldest first, and renew its lease.
-- A prefetch-0 consumer pulls: it asks for `max` messages (MessagePull), which a dispatch chunk fills.
-- In ack mode 'auto' the messages are acknowledged as they are handed over, but with `after` (below): that
-- adapter acknowledges them once it has written them, as it does pushed ones (outbox.adapter_acks).
-- ARGV: now, budget, consumer id, max, lease ms (0: the consumer's own lease length); optionally `after` and
-- `push` (an adapter taking pushed deliveries, outbox.lua push_*): the dispatch sequence of the last message it
-- has, so what was handed over after it (pushed, and lost or still on its way) comes first, again; and how
-- many messages may be pushed to it from now on, when this call leaves its outbox empty.
-- Returns {per message: id, packed message, redeliveries, group first, then the tail (includes/dispatch.lua
-- dispatch.add_tail)}; with `after`, {the dispatch sequence of the last message handed over, the
-- messages, the tail}. At most `max` messages, and no more once the reply holds about the call's byte
-- budget (outbox.lua outbox.CALL_MOST_BYTES), at least one: the rest stay for the next call, in order
-- (with `after` and a notify channel, a wake-up on it says so: fewer than `max` does not mean none left).
-- ARGV[8], `turn ms` (with ARGV[6] and [7] empty): first take the consumer's turn (broker_core/turns.py, the
-- ActiveMQ-compatible GET) for that long. Another request has it: {-1}, nothing else done. Messages are in
-- flight with the consumer (left by a request that died in its turn): {-2, how many}, the turn taken and
-- nothing received (the caller gives them back first). A consumer that does not exist: UNKNOWN_CONSUMER,
-- the turn taken.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local cid, max = ARGV[3], base.number(ARGV[4])
if ARGV[8] then
  if not redis.call('SET', base.K_C(cid) .. ':turn', '1', 'NX', 'PX', ARGV[8]) then return { -1 } end
  local left = redis.call('ZCARD', base.K_CINF(cid))
  if left > 0 then return { -2, left } end
end
local c, lease_until = consumers.find(cid)
if not c then return base.fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination') end
local lease = base.number(ARGV[5])
if lease <= 0 then lease = tonumber(c.def.lease) or 30000 end
message.renew_lease(cid, lease, lease_until)
local dispatched, more, hold = 0, 0, 0
local waiting = redis.call('LLEN', base.K_COUT(cid))
if waiting < max then
  if c.prefetch == 0 and c.ext < max - waiting then
    redis.call('HSET', base.K_C(cid), 'ext', max - waiting)
    message.room_freed(cid)
  end
  if c.prefetch == 0 then dispatch.receiver = cid end  -- (dispatch.lua: no wake-up for what this call hands over)
  dispatched, more, hold = dispatch.chunk(base.number(ARGV[2]))
end
-- (made at the size one message's reply takes: a table that grows is rebuilt at each power of two)
local out = { nil, nil, nil, nil, nil, nil, nil }
-- A dispatch chunk changes only a pull consumer's (prefetch 0) window, and a push its 'rcv' and 'push':
-- `c` is still current otherwise.
if c.prefetch == 0 or c.push > 0 then c = consumers.find(cid) end
local after = ARGV[6] and base.number(ARGV[6])
local freed = false
if after then
  outbox.adapter_acks = true
  out[1] = 0  -- (below)
  local again = {}
  if c.rcv > after then  -- handed over since `after`: at most a window's worth, `max` of them now
    local scored = redis.call('ZRANGEBYSCORE', base.K_CINF(cid), '(' .. base.NOW_TEXT.num(after), base.NOW_TEXT.num(c.rcv),
                              'WITHSCORES', 'LIMIT', 0, base.NOW_TEXT.num(max))
    for i = 1, #scored, 2 do again[#again + 1] = scored[i] end
    -- (the byte budget: those it leaves are handed over again by the next call, after this one's last)
    local n = #again > 0 and outbox.fit(again, 1) or 0
    for i = n + 1, #again do again[i] = nil end
    if n > 0 then out[1] = base.number(scored[2 * n]) end
  end
  if #again > 0 then freed = outbox.hand_over(c, again, out, false) end
  if #again < max and not outbox.cut then
    -- (everything handed over since `after` is in `again`: after it, 'rcv' is the last handed over)
    local _, popped = outbox.pop(c, max - #again, out, #again > 0 and 0 or 1)
    freed = freed or popped
    out[1] = c.rcv
  end
  -- armed for pushes only with nothing waiting in the outbox (outbox.push_armed: armed means the outbox is empty)
  local push = base.number(ARGV[7]) or 0
  if push > 0 and c.prefetch > 0 and c.def.notify and #out < 1 + 4 * max and not outbox.cut
     and redis.call('LLEN', base.K_COUT(cid)) == 0 then
    redis.call('HSET', base.K_C(cid), 'push', base.NOW_TEXT.num(push))
  elseif c.push > 0 then
    redis.call('HSET', base.K_C(cid), 'push', '0')
  end
else
  local _
  _, freed = outbox.pop(c, max, out)
end
if freed then  -- another chunk: handing messages over freed room (acknowledged, or expired on the way)
  local more_dispatched
  more_dispatched, more, hold = dispatch.chunk(base.number(ARGV[2]))
  dispatched = dispatched + more_dispatched
end
if after and outbox.cut and c.def.notify then
  redis.call('PUBLISH', c.def.notify, cid)  -- the byte budget left some: the adapter asks again at once
elseif dispatch.woken_later and c.def.notify and redis.call('LLEN', base.K_COUT(cid)) > 0 then
  redis.call('PUBLISH', c.def.notify, cid)  -- dispatched to it beyond what it took: the skipped wake-up
end
dispatch.add_tail(out, dispatched, forward.with_flag(more), hold)  -- (handing over may have expired some)
return out
