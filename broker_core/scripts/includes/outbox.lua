-- Handing dispatched messages to the adapter. The outbox is in dispatch order, so one number per consumer,
-- 'rcv' (the dispatch sequence of the last message handed over), tells received from not yet received.

local function received_upto(cid)
  return tonumber(redis.call('HGET', K_C(cid), 'rcv')) or 0
end

-- Pop up to `max` messages from c's outbox into `out` (id, packed message, redeliveries, group first);
-- in ack mode 'auto' they are acknowledged as they go. Returns how many.
local function pop_outbox(c, max, out)
  local ids = redis.call('LPOP', K_COUT(c.id), max)
  if not ids then return 0 end
  local last = redis.call('ZSCORE', K_CINF(c.id), ids[#ids])  -- before expiry may remove it
  local handed = {}
  for _, id in ipairs(ids) do
    local blob = redis.call('HGET', K_MSGS, id)
    local m = blob and unpack_message(blob)
    if m and is_expired(m) then
      -- consumerExpiryCheckEnabled: an expired message never reaches the application (EXPIRED ack).
      take_inflight(c.id, id, true)
      c.n = c.n - 1
      expire_message(id, m, blob)
    elseif blob then
      handed[#handed + 1] = id
      out[#out + 1] = id
      out[#out + 1] = blob
      out[#out + 1] = tonumber(redis.call('HGET', K_REDELIV, id)) or 0
      out[#out + 1] = redis.call('SISMEMBER', K_GFIRST, id)
    end
  end
  if last then redis.call('HSET', K_C(c.id), 'rcv', last) end
  if c.def.ack == 'auto' then
    for _, id in ipairs(handed) do ack_message(c, id) end
  end
  if c.def.ack == 'auto' or #handed < #ids then room_freed(c.id) end
  return #ids
end
