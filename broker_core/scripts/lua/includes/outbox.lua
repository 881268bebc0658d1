-- Handing dispatched messages to the adapter. The outbox is in dispatch order, so one number per consumer,
-- 'rcv' (the dispatch sequence of the last message handed over), tells received from not yet received.
-- Its module table is `outbox` (pushes below: the push_* fields).
local outbox = { received_upto = false, hand_over = false, pop = false, fit = false, PUSH_MOST_BYTES = 256 * 1024,
                 CALL_MOST_BYTES = 512 * 1024, call_bytes = 0, cut = false,
                 local_channel = nil, push_by_consumer = nil, push_order = nil, push_replies = nil,
                 push_armed = false, push_add = false, push_flush = false, adapter_acks = false }

function outbox.received_upto(cid)
  return base.number(redis.call('HGET', base.K_C(cid), 'rcv')) or 0
end

-- Hand messages `ids` of consumer c (in its dispatch order) to the adapter: into `out` as (id, packed message,
-- redeliveries, group first); with `check_expiry`, an expired one is expired instead (consumerExpiryCheck-
-- Enabled: it never reaches the application). In ack mode 'auto' they are acknowledged as they go, unless
-- outbox.adapter_acks (this call's adapter acknowledges them once written, as it does pushed ones: a
-- connection cut before they were written gives them back, as never received). Returns whether that freed
-- room in c's window. What it reads of the messages is one command per key for all of them.
function outbox.hand_over(c, ids, out, check_expiry)
  local blobs = base.call_many('HMGET', base.K_MSGS, ids)
  local redeliveries = base.call_many('HMGET', base.K_REDELIV, ids)
  local firsts = base.call_many('SMISMEMBER', base.K_GFIRST, ids)
  local handed = { nil }  -- (made with room for one: see ack.lua's reply)
  for i = 1, #ids do
    local id, blob = ids[i], blobs[i]
    -- the expiry is all this reads of the message (message.head, message.lua: without decoding it
    -- when it can)
    local exp = check_expiry and blob and message.head(blob)
    if check_expiry and blob and exp == nil then
      local m = message.unpack(blob)
      exp = m and (tonumber(m[message.EXPIRATION]) or 0) or 0
    end
    if check_expiry and blob and exp > 0 and base.NOW > exp then  -- is_expired
      local m = message.unpack(blob)
      lifecycle.take_inflight(c.id, id, true)
      c.n = c.n - 1
      lifecycle.expire_message(id, m, blob, true)
    elseif blob then
      outbox.call_bytes = outbox.call_bytes + #blob
      handed[#handed + 1] = id
      local n = #out  -- (once: a table's length is a search each time it is asked)
      out[n + 1] = id
      out[n + 2] = blob
      out[n + 3] = redeliveries[i] and base.number(redeliveries[i]) or 0
      out[n + 4] = firsts[i]
    end
  end
  local acked = c.def.ack == 'auto' and #handed > 0 and not outbox.adapter_acks
  if acked then lifecycle.ack_messages({ { c, handed } }) end
  local freed = acked or #handed < #ids
  if freed then message.room_freed(c.id) end
  return freed
end

-- The byte budget of a call: copying a message into Lua and into the reply costs by the byte (about 5 ms a
-- MiB), and a count bounds only the number of messages, so what one call pushes and hands over (and a browse
-- page, browse.lua) stops once it holds about outbox.CALL_MOST_BYTES. outbox.call_bytes is what this call
-- has taken so far; outbox.cut says a hand-over left some for the next call.
--@on-call
outbox.call_bytes, outbox.cut = 0, false
--@on-call-end

-- How many of `ids` (from the first, in order) this call takes within its byte budget: at least `least`, then
-- while the call holds less than outbox.CALL_MOST_BYTES. The sizes come from HSTRLEN (O(1), nothing
-- copied), so a message left for the next call is never read; hand_over counts what it then reads.
function outbox.fit(ids, least)
  local n, most = #ids, outbox.CALL_MOST_BYTES
  local taken = outbox.call_bytes
  -- (the destination's stored messages all together fit, by its usage, flow.lua 'mem', which counts each
  -- at least its packed bytes: no size need be read, the common case of a consumer keeping up)
  if n <= least then return n end
  if taken + (base.number(redis.call('HGET', flow.meta_key(), 'mem')) or 0) < most then return n end
  for i = 1, n do
    if i > least and taken >= most then
      outbox.cut = true
      return i - 1
    end
    taken = taken + redis.call('HSTRLEN', base.K_MSGS, ids[i])
  end
  return n
end

-- Pop up to `max` messages from c's outbox into `out` (outbox.hand_over), within the call's byte budget
-- (outbox.fit: at least `least`, 1 if not given, so a consumer always progresses; the rest stay at the front of
-- the outbox). Returns how many, and whether that freed room in c's window (acknowledged, or expired on the
-- way): the caller then runs a dispatch chunk, or the room stays unused until something else does.
function outbox.pop(c, max, out, least)
  local key = base.K_COUT(c.id)
  local ids = redis.call('LRANGE', key, 0, max - 1)
  local n = #ids > 0 and outbox.fit(ids, least or 1) or 0
  if n == 0 then return 0, false end
  for i = n + 1, #ids do ids[i] = nil end
  redis.call('LTRIM', key, n, -1)
  local last = redis.call('ZSCORE', base.K_CINF(c.id), ids[#ids])  -- before expiry may remove it
  if last then
    redis.call('HSET', base.K_C(c.id), 'rcv', last)
    c.rcv = base.number(last)
  end
  return #ids, outbox.hand_over(c, ids, out, true)
end

-- Pushed deliveries (docs/broker_core.md "The delivery path"). A consumer whose adapter waits with an empty
-- outbox is armed: 'push' in its hash says how many more messages may reach it this way (receive.lua sets
-- it, each push takes one; armed means the outbox is empty). A dispatch to an armed consumer hands the
-- message over at once, as receive would: in flight, 'rcv' raised to its dispatch sequence, and the message
-- itself published on the consumer's `notify` channel, so the adapter writes it with no receive call. The
-- in-flight entry and the lease are what make this safe: an adapter that dies before writing it leaves the
-- message in flight, and its consumer's lapsed lease returns it (redelivered, as a received one).
-- A push to the calling process's own channel (outbox.local_channel, given by the send) goes back in the
-- script's reply instead of through Redis pub/sub. Ack mode 'auto': the adapter acknowledges after writing.
-- Payload, msgpack: {consumer id, rcv before the push, then per message: dispatch sequence, id, packed
-- message, redeliveries, group first (1/0)}; the adapter knows from `rcv before` whether it missed any.
-- A consumer's pushes in one call stop at about outbox.PUSH_MOST_BYTES (the rest wait in its outbox, with the
-- usual wake-up): a pub/sub subscriber past Redis's output buffer limit for pub/sub is disconnected. All
-- consumers' pushes together stop at about outbox.CALL_MOST_BYTES (push_armed), the call's byte budget.
--@on-call
outbox.local_channel, outbox.push_by_consumer, outbox.push_order, outbox.push_replies = nil, nil, nil, nil
outbox.adapter_acks = false
--@on-call-end
-- Past the call's byte budget (outbox.CALL_MOST_BYTES, across consumers: one chunk may push a large message
-- to each of many) an armed consumer is disarmed instead, and the message waits in its outbox with the usual
-- wake-up (armed must mean the outbox is empty).
function outbox.push_armed(c)
  if c.push == nil or c.push <= 0 or c.def.notify == nil then return false end
  if outbox.call_bytes < outbox.CALL_MOST_BYTES then return true end
  c.push = 0
  c.push_write = true  -- (written with its counters at the end of the pass, dispatch.flush_consumer)
  return false
end
function outbox.push_add(c, id, dseq, blob, redeliveries, first)
  local by = outbox.push_by_consumer
  if not by then
    by = {}
    outbox.push_by_consumer, outbox.push_order = by, {}
  end
  local mine = by[c.id]
  if not mine then
    -- (msg made with room for one message: a table that grows is rebuilt at each power of two)
    mine = { c = c, msg = { c.id, c.rcv or 0, nil, nil, nil, nil, nil }, bytes = 0 }
    by[c.id] = mine
    outbox.push_order[#outbox.push_order + 1] = mine
  end
  local msg = mine.msg
  msg[#msg + 1] = dseq
  msg[#msg + 1] = id
  msg[#msg + 1] = blob
  msg[#msg + 1] = base.number(redeliveries) or 0
  msg[#msg + 1] = first and 1 or 0
  c.push = c.push - 1
  c.rcv = dseq
  mine.bytes = mine.bytes + #blob
  outbox.call_bytes = outbox.call_bytes + #blob
  -- disarmed past the byte bounds: what follows goes to the outbox, and armed must mean the outbox is empty
  if mine.bytes >= outbox.PUSH_MOST_BYTES or outbox.call_bytes >= outbox.CALL_MOST_BYTES then c.push = 0 end
end
-- Publish (or keep for the reply) the pushed consumers' messages; the dispatch pass calls it after each
-- page, under the prefix of the consumers it pushed to. Their 'push' and 'rcv' are written with their other
-- counters at the end of the pass (c.push_write, dispatch.lua dispatch.flush_consumer): one write per consumer.
function outbox.push_flush()
  local order = outbox.push_order
  if not order then return end
  outbox.push_by_consumer, outbox.push_order = nil, nil
  for i = 1, #order do
    local mine = order[i]
    local c = mine.c
    c.push_write = true
    local payload = cmsgpack.pack(mine.msg)
    if c.def.notify == outbox.local_channel then
      outbox.push_replies = outbox.push_replies or {}
      outbox.push_replies[#outbox.push_replies + 1] = payload
    else
      redis.call('PUBLISH', c.def.notify, payload)
    end
  end
end
