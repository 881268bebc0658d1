-- Browse a queue without changing it: pending messages in dispatch order, then parked ones (redelivery
-- delay, scheduled), then in-flight ones; optionally only those a selector matches. Bounded: examines
-- at most ARGV[4] messages per call and returns where to continue.
-- ARGV: now, cursor ('' = start; 'p:<score>', 'k:<score>', 'i:<hscan cursor>'), limit, examine budget,
-- compiled selector JSON or ''.
-- Returns {next cursor ('' when done), then per message: id, packed, state, consumer, redeliveries}.
--@include base
--@include dispatch
NOW = tonumber(ARGV[1])
local cursor, limit, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local expr = false
if ARGV[5] ~= '' then expr = cjson.decode(ARGV[5]) end
local out = { '' }
local found, examined = 0, 0

local function offer(id, state, cid)
  examined = examined + 1
  local blob = redis.call('HGET', K_MSGS, id)
  if not blob and state == 'parked' then
    local job = redis.call('HGET', K_SCHED, id)
    if job then blob = cmsgpack.unpack(job)[1] end
  end
  if not blob then return end
  if expr and not selector_matches(expr, selector_view(id, unpack_message(blob))) then return end
  out[#out + 1] = id
  out[#out + 1] = blob
  out[#out + 1] = state
  out[#out + 1] = cid or ''
  out[#out + 1] = tonumber(redis.call('HGET', K_REDELIV, id)) or 0
  found = found + 1
end

-- One ordered phase over a zset: returns the cursor to continue with, or nil when the zset is done.
local function walk_zset(key, tag, state, from)
  local lower = from == '' and '-inf' or '(' .. from
  while found < limit and examined < budget do
    local batch = redis.call('ZRANGEBYSCORE', key, lower, '+inf', 'WITHSCORES', 'LIMIT', 0,
                             math.min(100, budget - examined))
    if #batch == 0 then return nil end
    for i = 1, #batch, 2 do
      offer(batch[i], state)
      lower = '(' .. batch[i + 1]
      if found >= limit or examined >= budget then return tag .. ':' .. batch[i + 1] end
    end
  end
  return tag .. ':' .. string.sub(lower, 2)
end

local phase, position = string.match(cursor, '^(%a):(.*)$')
if cursor == '' then phase, position = 'p', '' end
if phase == 'p' then
  local next_cursor = walk_zset(K_PENDING, 'p', 'pending', position)
  if next_cursor then out[1] = next_cursor return out end
  phase, position = 'k', ''
end
if phase == 'k' then
  local next_cursor = walk_zset(K_PARKED, 'k', 'parked', position)
  if next_cursor then out[1] = next_cursor return out end
  phase, position = 'i', '0'
end
if phase == 'i' then
  repeat
    local page = redis.call('HSCAN', K_INFLIGHT, position, 'COUNT', 100)
    position = page[1]
    for i = 1, #page[2], 2 do offer(page[2][i], 'inflight', string.match(page[2][i + 1], '^([^|]*)')) end
  until position == '0' or found >= limit or examined >= budget
  if position ~= '0' then out[1] = 'i:' .. position end
end
return out
