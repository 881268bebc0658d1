-- Handing dispatched messages to the adapter. The outbox is in dispatch order, so one number per consumer,
-- 'rcv' (the dispatch sequence of the last message handed over), tells received from not yet received.

local function received_upto(cid)
  return tonumber(redis.call('HGET', K_C(cid), 'rcv')) or 0
end

-- Pop up to `max` messages from c's outbox into `out` (id, packed message, redeliveries, group first);
-- in ack mode 'auto' they are acknowledged as they go. Returns how many, and whether that freed room in c's
-- window (acknowledged, or expired on the way): the caller then runs a dispatch chunk, or the room stays
-- unused until something else does. What it reads of the messages is one command per key for all of them.
local function pop_outbox(c, max, out)
  local ids = redis.call('LPOP', K_COUT(c.id), NOW_TEXT.num(max))
  if not ids then return 0, false end
  local last = redis.call('ZSCORE', K_CINF(c.id), ids[#ids])  -- before expiry may remove it
  local blobs = call_many('HMGET', K_MSGS, ids)
  local redeliveries = call_many('HMGET', K_REDELIV, ids)
  local firsts = call_many('SMISMEMBER', K_GFIRST, ids)
  local handed = { nil }  -- (made with room for one: see ack.lua's reply)
  for i = 1, #ids do
    local id, blob = ids[i], blobs[i]
    -- the expiry is all this reads of the message (POLICY_DECODED.head, message.lua: without decoding it
    -- when it can)
    local exp = blob and POLICY_DECODED.head(blob)
    if blob and exp == nil then
      local m = unpack_message(blob)
      exp = m and (tonumber(m[M_EXPIRATION]) or 0) or 0
    end
    if blob and exp > 0 and NOW > exp then  -- is_expired
      local m = unpack_message(blob)
      -- consumerExpiryCheckEnabled: an expired message never reaches the application (EXPIRED ack).
      take_inflight(c.id, id, true)
      c.n = c.n - 1
      expire_message(id, m, blob)
    elseif blob then
      handed[#handed + 1] = id
      out[#out + 1] = id
      out[#out + 1] = blob
      out[#out + 1] = redeliveries[i] and tonumber(redeliveries[i]) or 0
      out[#out + 1] = firsts[i]
    end
  end
  if last then redis.call('HSET', K_C(c.id), 'rcv', last) end
  if c.def.ack == 'auto' then ack_messages({ { c, handed } }) end
  local freed = c.def.ack == 'auto' or #handed < #ids
  if freed then room_freed(c.id) end
  return #ids, freed
end
