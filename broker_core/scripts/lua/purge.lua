-- Purge (QueueView.purge, spec §14.3) in bounded calls: removes the messages the queue held when the purge
-- began, the ones whose broker sequence is at most the mark, wherever they are: parked, then pending, then
-- in flight (ActiveMQ's purge takes dispatched messages too), then held for a transaction (its consumer closed). Messages sent after the mark stay, as in
-- ActiveMQ, whose purge holds the queue's send lock. Each call examines at most ARGV[5] messages and
-- says where the next one goes on; counted as purged (a repeating scheduled message's job: cancelled).
-- ARGV: now, budget, mark ('' on the first call: the current sequence becomes the mark), cursor ('' = the
-- start; 'k:<score>|<id>' parked, 'p:<score>|<id>' pending (the last message kept), 'i:<consumers' HSCAN
-- cursor>:<consumer>:<dispatch sequence>' in flight, 'c:...' the same for closed consumers still returning
-- messages, 'h:<score>|<id>' those held for transactions, the last kept), examine budget[, tally key: a temporary destination's deletion (ops/router.py
-- delete_temporary) counts what each call removes in that hash's `messages`, in the same step].
-- Returns {removed, next cursor ('' when done), mark, the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
base.NOW = tonumber(ARGV[1])
local unknown = base.unknown_destination()
if unknown then return unknown end
local mark = tonumber(ARGV[3]) or tonumber(redis.call('HGET', base.K_META, 'seq')) or 0
local budget = tonumber(ARGV[5])
local examined, purged, cancelled = 0, 0, 0

-- Whether a message was there at the mark, from its pending score (the sequence is its low 44 bits in
-- every band: priority, and returned messages' 2^45 below).
local function old(score)
  return tonumber(score) % message.PRIORITY_BAND <= mark
end

local function remove(id)
  local blob, scheduled = operator.take_out(id)  -- (not on the queue yet: cancelled, not purged)
  if scheduled then
    cancelled = cancelled + 1
    base.emit('cancel', 'msg', id)
  elseif blob then
    purged = purged + 1
  end
end

-- Walks a zset from its head and collects its old messages in `out` (taken out after the walk); the position
-- is the last message kept ('<score>|<id>'), since taken ones leave: the walk goes on after it (its rank),
-- or, when it has gone meanwhile, from the first message of its score. Returns the position to continue
-- from, or nil when the zset is done.
local function walk(key, tag, position, is_old, out)
  local score, last = string.match(position, '^(.-)|(.*)$')
  if last == '' then score, last = nil, nil end
  local kept_score, kept = score, last
  local rank = last and redis.call('ZRANK', key, last)
  if last and not rank then rank = redis.call('ZCOUNT', key, '-inf', '(' .. score) - 1 end
  rank = rank or -1
  while examined < budget do
    local want = math.min(100, budget - examined)
    local batch = redis.call('ZRANGE', key, rank + 1, rank + want, 'WITHSCORES')
    for i = 1, #batch, 2 do
      local id, s = batch[i], batch[i + 1]
      examined = examined + 1
      if is_old(id, s) then out[#out + 1] = id else kept_score, kept = s, id end
    end
    rank = rank + #batch / 2
    if #batch < 2 * want then return nil end
  end
  return tag .. ':' .. (kept_score or '') .. '|' .. (kept or '')
end

local function parked_old(id)
  local info = redis.call('HGET', base.K_PARKINFO, id)
  if not info then return false end
  local score = lifecycle.parked_score(info)
  return score == nil or old(score)  -- (a job: its firings are new messages)
end

local function pending_old(_, score) return old(score) end

-- A message held for a transaction (includes/lifecycle.lua txheld_key; its consumer closed since the
-- transaction acknowledged it) is in flight too: its pending score is in its mark, '<tx key>|<score>'.
local function held_old(id)
  local score = string.match(redis.call('HGET', lifecycle.txacks_key(), id) or '', '|([^|]*)$')
  return score ~= nil and old(score)
end

-- Old messages of consumer `cid`'s window (ids, with their dispatch sequences), taken out together: one
-- command per key (take_out's steps for a message in flight, for all of them).
local function take_window(cid, ids, dseqs)
  if #ids == 0 then return end
  local received = outbox.received_upto(cid)
  for i = 1, #ids do
    if dseqs[i] > received then redis.call('LREM', base.K_COUT(cid), 1, ids[i]) end  -- at the outbox's head
  end
  base.call_many('HDEL', base.K_INFLIGHT, ids)
  base.call_many('ZREM', base.K_CINF(cid), ids)
  redis.call('HINCRBY', base.K_C(cid), 'n', -#ids)
  message.room_freed(cid)
  lifecycle.drop_messages(ids)
  purged = purged + #ids
end

-- In flight: consumer by consumer (a page of the consumers hash at a time, in name order within it), each
-- window in dispatch order, so a message not yet received is met at the head of the consumer's outbox.
-- `consumers` is the consumers hash (tag 'i'), then the closed consumers whose returns are still owed
-- (tag 'c': their windows hold messages until returned, and the purge takes those too).
local function in_flight(consumers, tag, hcur, from_cid, after)
  while examined < budget do
    local page = redis.call('HSCAN', consumers, hcur, 'COUNT', 10)
    local names = {}
    for i = 1, #page[2], 2 do names[#names + 1] = page[2][i] end
    table.sort(names)
    for _, cid in ipairs(names) do
      if from_cid == '' or cid >= from_cid then
        local seen = cid == from_cid and after or ''  -- the dispatch sequence walked up to
        while true do
          local want = math.min(100, budget - examined)
          if want == 0 then return tag .. ':' .. hcur .. ':' .. cid .. ':' .. seen end
          local low = seen == '' and '-inf' or '(' .. seen
          local batch = redis.call('ZRANGEBYSCORE', base.K_CINF(cid), low, '+inf', 'WITHSCORES', 'LIMIT', 0, want)
          local ids = {}
          for i = 1, #batch, 2 do ids[#ids + 1] = batch[i] end
          local where = base.call_many('HMGET', base.K_INFLIGHT, ids)  -- 'consumer|pending score'
          local old_ids, dseqs = {}, {}
          for i = 1, #ids do
            examined = examined + 1
            if where[i] and old(string.match(where[i], '|(.*)$')) then
              old_ids[#old_ids + 1], dseqs[#dseqs + 1] = ids[i], tonumber(batch[2 * i])
            end
            seen = batch[2 * i]
          end
          take_window(cid, old_ids, dseqs)
          if #batch < 2 * want then break end
        end
      end
    end
    from_cid, after, hcur = '', '', page[1]
    if hcur == '0' then return nil end
  end
  return tag .. ':' .. hcur .. '::'
end

local cursor = ARGV[4]
local phase, position = string.match(cursor, '^(%a):(.*)$')
if cursor == '' then phase, position = 'k', '' end
local parked, leaving = {}, {}  -- old parked messages (maybe jobs), old pending ones
if phase == 'k' then
  cursor = walk(base.K_PARKED, 'k', position, parked_old, parked)
  if not cursor then phase, position = 'p', '' end
end
if phase == 'p' then
  cursor = walk(base.K_PENDING, 'p', position, pending_old, leaving)
  if not cursor then phase, position = 'i', '0::' end
end
if phase == 'i' then
  local hcur, cid, after = string.match(position, '^([^:]*):([^:]*):(.*)$')
  cursor = in_flight(base.K_CONSUMERS, 'i', hcur, cid, after)
  if not cursor then phase, position = 'c', '0::' end
end
if phase == 'c' then
  local hcur, cid, after = string.match(position, '^([^:]*):([^:]*):(.*)$')
  cursor = in_flight(base.P .. ':closing', 'c', hcur, cid, after)
  if not cursor then phase, position = 'h', '' end
end
local held = {}  -- old messages held for transactions
if phase == 'h' then
  cursor = walk(lifecycle.txheld_key(), 'h', position, held_old, held) or ''
end
for _, id in ipairs(parked) do remove(id) end
if #leaving > 0 then
  base.call_many('ZREM', base.K_PENDING, leaving)
  message.pass_dirty.pending = nil
  lifecycle.drop_messages(leaving)
  purged = purged + #leaving
end
if #held > 0 then  -- (drop_messages forgets their marks: the commit refuses their acks, nothing applied)
  base.call_many('ZREM', lifecycle.txheld_key(), held)
  lifecycle.drop_messages(held)
  purged = purged + #held
end
if purged > 0 then
  base.meta_incr('purged', purged)
  base.meta_incr('dequeued', purged)
end
if cancelled > 0 then base.meta_incr('cancelled', cancelled) end
if purged + cancelled > 0 then
  if ARGV[6] and ARGV[6] ~= '' then redis.call('HINCRBY', ARGV[6], 'messages', purged + cancelled) end
  base.emit('purge', 'count', purged + cancelled)
  message.reset_pass()
end
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ purged + cancelled, cursor, base.NOW_TEXT.num(mark), nil, nil, nil }, dispatched, more, hold)
