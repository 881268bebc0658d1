-- Return in-flight messages of a consumer to the destination at once, redelivery counter raised
-- (transaction rollback, session recover). ARGV: now, budget, consumer id, the rolled back transaction's key
-- ('' for none), keep ('1': see below, else '0'), message ids... A message held for that transaction, its
-- consumer closed since (includes/lifecycle.lua txacks_key), goes back as its close would have put it (its
-- counter raised then), whether or not the consumer is still there; with the consumer gone, the other ids
-- are skipped (they went back with its close or left since), and the call refused (UNKNOWN_CONSUMER) only
-- when none is held.
-- keep '1' (a rollback whose adapter's client keeps what it was given: STOMP's ABORT, as ActiveMQ's broker
-- leaves a rolled back ack's messages with their live consumer): the listed messages still in flight with
-- the consumer stay there, delivered; only the window their transacted acks opened closes again and the
-- transaction's marks on them go; one no longer in flight is skipped.
-- Returns {returned count, the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local cid, tx, keep = ARGV[3], ARGV[4], ARGV[5] == '1'
local listed = {}
for i = 6, #ARGV do listed[#listed + 1] = ARGV[i] end
local held = tx ~= '' and lifecycle.held_for(tx, listed) or {}
local is_held = {}
for _, id in ipairs(held) do is_held[id] = true end
local ids, seqs, live = {}, {}, nil
for _, id in ipairs(listed) do
  if not is_held[id] then
    if live == nil then live = redis.call('HEXISTS', base.K_CONSUMERS, cid) == 1 end
    -- the consumer closed: a rolled back message it did not leave held went back with the close, or left
    -- the queue since (an operator removed it): nothing to give back, and the held ones go back all the same
    if not live and #held == 0 then
      return base.fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination')
    end
  end
  if not is_held[id] and live then
    local seq = redis.call('ZSCORE', base.K_CINF(cid), id)
    if not seq and not keep then
      return base.fail('NOT_IN_FLIGHT', 'message ' .. id .. ' is not in flight with consumer ' .. cid)
    end
    if seq and not seqs[id] then ids[#ids + 1] = id end
    seqs[id] = tonumber(seq)
  end
end
local back = 0
if #held > 0 then
  local once, seen = {}, {}
  for _, id in ipairs(held) do
    if not seen[id] then once[#once + 1] = id end
    seen[id] = true
  end
  back = lifecycle.return_held(once, 'rollback')
end
if #ids == 0 then
  local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
  return dispatch.add_tail({ back, nil, nil, nil }, dispatched, more, hold)
end
if keep then  -- they stay delivered: the window shrinks back, and this transaction's marks go
  local marks = base.call_many('HMGET', lifecycle.txacks_key(), ids)
  local unmark = {}
  for i = 1, #ids do
    if marks[i] == tx then unmark[#unmark + 1] = ids[i] end
  end
  base.call_many('HDEL', lifecycle.txacks_key(), unmark)
  local ext = tonumber(redis.call('HGET', base.K_C(cid), 'ext')) or 0
  if ext > 0 then redis.call('HSET', base.K_C(cid), 'ext', math.max(0, ext - #ids)) end
  local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
  return dispatch.add_tail({ back, nil, nil, nil }, dispatched, more, hold)
end
local rcv = outbox.received_upto(cid)
local window = {}
for _, id in ipairs(ids) do
  if seqs[id] > rcv then redis.call('LREM', base.K_COUT(cid), 1, id) end  -- never received: no bump
  local n = #window
  window[n + 1], window[n + 2] = id, seqs[id]
end
lifecycle.return_messages(cid, window, rcv, 'rollback')
-- The window opened by DELIVERED acks (a transaction's acks) closes again, never below zero.
local ext = tonumber(redis.call('HGET', base.K_C(cid), 'ext')) or 0
redis.call('HSET', base.K_C(cid), 'ext', math.max(0, ext - #ids))
message.room_freed(cid)
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ #ids + back, nil, nil, nil }, dispatched, more, hold)
