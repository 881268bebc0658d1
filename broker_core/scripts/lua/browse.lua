-- Browse a queue without changing it: pending messages in dispatch order, then parked ones (redelivery
-- delay, scheduled), then in-flight ones (then those held for a transaction, 'h:<score>|<id>'); optionally only those a selector matches. Bounded: examines
-- at most ARGV[4] messages per call, and reads no more once it has read about the call's byte budget
-- (outbox.lua outbox.CALL_MOST_BYTES, at least one message), and returns where to continue.
-- ARGV: now, cursor ('' = start; 'p:<score>|<id>', 'k:<score>|<id>', 'i:<hscan cursor>' or, inside an
-- HSCAN page, 'i:<hscan cursor of that page>|<last id>'), limit, examine budget,
-- compiled selector JSON or '', '0' to leave parked messages out (a queue browser's view: ActiveMQ keeps
-- scheduled and delayed messages outside the queue until they are due), '1', or 's': the scheduled parked
-- ones alone (jobs and delayed messages, not those waiting for a redelivery delay: ActiveMQ's scheduler
-- management browses its job store), due at most at ARGV[7] ('' = any time), for which a cursor of
-- 'k:<time>|' starts at that due time.
-- Returns {next cursor ('' when done), then per message: id, packed, state, consumer, redeliveries, and last
-- how many messages it examined (a queue browser counts them against its page, Link.browse)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local unknown = base.unknown_destination()
if unknown then return unknown end
local cursor, limit, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local expr = false
if ARGV[5] ~= '' then expr = cjson.decode(ARGV[5]) end
local out = { '' }
local found, examined, bytes = 0, 0, 0
local selector_work = selector.bytes  -- (selector.lua: the call ends once it has matched enough)

local function offer(id, state, cid)
  examined = examined + 1
  local blob = redis.call('HGET', base.K_MSGS, id)
  if not blob and state == 'parked' then
    local job = redis.call('HGET', base.K_SCHED, id)
    if job then blob = cmsgpack.unpack(job)[1] end
  end
  if not blob then return end
  bytes = bytes + #blob
  if expr then
    local ok = selector.matches(expr, message.selector_view(id, message.unpack(blob)))
    if selector.bytes - selector_work >= selector.call_limit then examined = budget end
    if not ok then return end
  end
  out[#out + 1] = id
  out[#out + 1] = blob
  out[#out + 1] = state
  out[#out + 1] = cid or ''
  out[#out + 1] = tonumber(redis.call('HGET', base.K_REDELIV, id)) or 0
  found = found + 1
end

-- The reply, with how many messages the call examined last.
local function finish()
  out[#out + 1] = examined
  return out
end

local scheduled_only = ARGV[6] == 's'
local due_by = scheduled_only and ARGV[7] ~= '' and tonumber(ARGV[7])

-- One ordered phase over a zset: returns the cursor to continue with ('<tag>:<score>|<id>' of the last
-- message seen), or nil when the zset is done. Scores can tie (parked times often do), so a walk goes on
-- from the rank of the last id seen; if that id has gone meanwhile, from its score, skipping the ids
-- of that score it has seen (equal scores are ordered by id).
local function walk_zset(key, tag, state, from)
  local score, last = string.match(from, '^(.-)|(.*)$')
  while found < limit and examined < budget and bytes < outbox.CALL_MOST_BYTES do
    local want = math.min(100, budget - examined)
    local batch
    local rank = last and redis.call('ZRANK', key, last)
    if not last then
      batch = redis.call('ZRANGE', key, 0, want - 1, 'WITHSCORES')
    elseif rank then
      batch = redis.call('ZRANGE', key, rank + 1, rank + want, 'WITHSCORES')
    else
      batch = redis.call('ZRANGEBYSCORE', key, score, '+inf', 'WITHSCORES', 'LIMIT', 0, want)
    end
    if #batch == 0 then return nil end
    for i = 1, #batch, 2 do
      local id, s = batch[i], batch[i + 1]
      if due_by and tonumber(s) > due_by then return nil end  -- (parked in due order: none later is wanted)
      if scheduled_only and not select(2, lifecycle.parked_score(redis.call('HGET', base.K_PARKINFO, id) or '')) then
        examined = examined + 1  -- waiting for a redelivery delay: no job
      elseif rank or not last or not (s == score and id <= last) then
        offer(id, state)
      else
        examined = examined + 1
      end
      score, last = s, id
      if found >= limit or examined >= budget or bytes >= outbox.CALL_MOST_BYTES then
        return tag .. ':' .. s .. '|' .. id
      end
    end
    if #batch < 2 * want then return nil end
  end
  return tag .. ':' .. score .. '|' .. last
end

local phase, position = string.match(cursor, '^(%a):(.*)$')
if cursor == '' then phase, position = 'p', '' end
if scheduled_only and phase == 'p' then phase, position = 'k', '' end
if phase == 'p' then
  local next_cursor = walk_zset(base.K_PENDING, 'p', 'pending', position)
  if next_cursor then out[1] = next_cursor return finish() end
  phase, position = 'k', ''
end
if phase == 'k' and ARGV[6] == '0' then phase, position = 'i', '0' end
if phase == 'k' then
  local next_cursor = walk_zset(base.K_PARKED, 'k', 'parked', position)
  if next_cursor then out[1] = next_cursor return finish() end
  if scheduled_only then return finish() end
  phase, position = 'i', '0'
end
if phase == 'i' then
  -- A page is offered in id order, so a call that stops inside it (its limit, or the byte budget) says where:
  -- the next scans the same HSCAN cursor again and goes on after that id.
  local from, last = string.match(position, '^(.-)|(.*)$')
  if from then position = from end
  repeat
    local at = position
    local page = redis.call('HSCAN', base.K_INFLIGHT, at, 'COUNT', 100)
    position = page[1]
    local entries, order, held = page[2], {}, {}
    for i = 1, #entries, 2 do
      local id = entries[i]
      if not last or id > last then
        order[#order + 1] = id
        held[id] = entries[i + 1]
      end
    end
    table.sort(order)  -- (without a comparison function: compared in C)
    last = nil
    for k = 1, #order do
      local id = order[k]
      offer(id, 'inflight', string.match(held[id], '^([^|]*)'))
      if k < #order and (found >= limit or bytes >= outbox.CALL_MOST_BYTES) then
        out[1] = 'i:' .. at .. '|' .. id
        return finish()
      end
    end
  until position == '0' or found >= limit or examined >= budget or bytes >= outbox.CALL_MOST_BYTES
  if position ~= '0' then out[1] = 'i:' .. position return finish() end
  phase, position = 'h', ''
end
-- Messages held for a transaction (its consumer closed since its ack: includes/lifecycle.lua
-- txheld_key) are in flight too, with no consumer; an operator's browse shows them (not a queue
-- browser's: they are acknowledged, and never dispatched again unless the transaction rolls back).
if phase == 'h' and ARGV[6] ~= '0' and redis.call('ZCARD', lifecycle.txheld_key()) > 0 then
  if found >= limit or examined >= budget or bytes >= outbox.CALL_MOST_BYTES then
    out[1] = 'h:' .. position  -- (the windows' messages filled this call: the held ones next)
    return finish()
  end
  out[1] = walk_zset(lifecycle.txheld_key(), 'h', 'inflight', position) or ''
end
return finish()
