-- Pieces of the operator's message operations (spec §14.3): where a message is, taking it out. Its module
-- table is `operator`.
local operator = { locate = false, take_out = false }

-- Where message `id` is: 'pending', 'parked', 'inflight' (with the consumer), or nil.
function operator.locate(id)
  if redis.call('ZSCORE', base.K_PENDING, id) then return 'pending' end
  if redis.call('ZSCORE', base.K_PARKED, id) then return 'parked' end
  local v = redis.call('HGET', base.K_INFLIGHT, id)
  if v then return 'inflight', string.match(v, '^([^|]*)') end
  return nil
end

-- Take a stored message out of this destination, wherever it is; returns its packed form, and true
-- when it was a scheduled one not yet on the queue, a delayed message or a repeating message's job
-- (cancelled, never enqueued: lifecycle.lua parked_score).
function operator.take_out(id)
  local where, cid = operator.locate(id)
  local scheduled = false
  -- a topic's own keys: only its jobs are its own (its messages are its subscriptions', stored once for
  -- all of them, lifecycle.lua fans_out), so nothing else is taken out there
  if where ~= 'parked' and lifecycle.fans_out() then return nil, false end
  if where == 'pending' then
    redis.call('ZREM', base.K_PENDING, id)
    message.pass_dirty.pending = nil  -- (message.lua)
  elseif where == 'parked' then
    local info = redis.call('HGET', base.K_PARKINFO, id)
    if info then scheduled = select(2, lifecycle.parked_score(info)) end
    redis.call('ZREM', base.K_PARKED, id)
    lifecycle.unparked(id, info)
    lifecycle.parked.next = nil
  elseif where == 'inflight' then
    if tonumber(redis.call('ZSCORE', base.K_CINF(cid), id)) > outbox.received_upto(cid) then
      redis.call('LREM', base.K_COUT(cid), 1, id)  -- dispatched, not yet handed over
    end
    lifecycle.take_inflight(cid, id)
    message.room_freed(cid)
  elseif not where then  -- held for a transaction (lifecycle.lua txheld_key): its commit will not find it
    redis.call('ZREM', lifecycle.txheld_key(), id)
  end
  local blob = not lifecycle.fans_out() and redis.call('HGET', base.K_MSGS, id)
  local job = nil
  if not blob and where == 'parked' then  -- a repeating scheduled message: cancel the job
    job = redis.call('HGET', base.K_SCHED, id)
    redis.call('HDEL', base.K_SCHED, id)
    if job then blob = cmsgpack.unpack(job)[1]; flow.memory_release(#blob) end
  end
  if not lifecycle.fans_out() then lifecycle.drop_message(id) end
  return blob, scheduled or job ~= nil
end
