-- The rate history's sampler (broker_core/rates.py, docs/broker_core.md "Rate history"): reads the
-- cumulative counters of a few destinations and adds what moved since each one's previous sample into
-- its two rings (5 s x 720, 1 min x 1440) and into the namespace's rings (the overview's chart).
-- KEYS: the namespace's rate key (<ns>:rates), then the destinations' prefixes.
-- ARGV: now, kinds ('q' or 't' per destination), pass_span (ms since the previous pass began: the span
-- the namespace's slot gets from this call; 0 for the pass's further calls), keep_ms, budget (subscriptions
-- read at most in this call), then for a first topic continued from the previous call (else 0, '', ''):
-- start (where in its subscription list, :sorder, to go on), last (the subscription read last), carry (the
-- sums of its subscriptions read so far, comma-separated).
-- A topic counts every subscription, as topics.stats does, read over as many calls as the budget needs:
-- a call that cannot finish one stops there and replies where it goes on; the topic is sampled by the call
-- that reads its last part. Parts are one count only if no subscription before the cursor went in between
-- (removed, its counters go to the topic's ended_*, read with the last part: counted twice; and the one
-- after it shifts back, unread): the list shifts, so the subscription at start - 1 is no longer `last`,
-- and the topic is left out of this pass (not sampled: its next sample covers both spans). Subscriptions
-- made meanwhile are appended, read by a later part.
-- Returns {destinations sampled, destinations done (of KEYS[2..]), then, when one did not fit (done < its
-- count): where its subscriptions go on, the one read last, the carry}.
-- A ring is a string of fixed slots, slot = epoch % size, 32 bytes: epoch, span (ms the deltas cover),
-- then one delta per series of the first six (all unsigned 32-bit big-endian). A series added since
-- (`discarded`) has a ring of its own beside it, <ring>:discarded, of 8-byte slots (epoch, delta; the span
-- is the main slot's), written only when it moved, so the stored layout of the first six never changed
-- and history from before reads as written. A slot whose epoch is not the one asked for is stale (a lap
-- behind) and is overwritten.
local NOW = tonumber(ARGV[1])
local KINDS = ARGV[2]
local PASS_SPAN = tonumber(ARGV[3])
local KEEP = tonumber(ARGV[4])
local budget = tonumber(ARGV[5])
local START, LAST = tonumber(ARGV[6]), ARGV[7]
local CARRY = {}
for v in string.gmatch(ARGV[8], '[^,]+') do CARRY[#CARRY + 1] = tonumber(v) end
local RINGS = { { '5s', 5000, 720 }, { '1m', 60000, 1440 } }  -- (rates.py RINGS)
-- enqueued, dispatched, acked, redelivered, expired, deadlettered in the slot; discarded in its own ring
-- (rates.py SERIES, SLOTTED, ADDED)
local SERIES = 7
local SLOTTED = 6
local ADDED = { [7] = 'discarded' }
local SLOT = 8 + 4 * SLOTTED
local ADDED_SLOT = 8
-- Deltas over a longer span than this (the sampler was stopped) stay out of the namespace's rings: the
-- destination's own ring spreads them over the span, the sum of all would draw them as one spike.
local NS_GAP_MS = 15000
local U32 = 4294967295

local function u32(n)
  n = math.floor(n)
  if n < 0 then n = 0 elseif n > U32 then n = U32 end
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256,
                     n % 256)
end

local function read_u32(s, i)
  local a, b, c, d = string.byte(s, i, i + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end

-- Adds `delta` (covering `span` ms) to the slot of NOW's epoch; a sample of nothing only lengthens the
-- span of a slot this epoch already has (a missing slot reads as zero). An added series that moved goes
-- to its own ring's slot of the same epoch (a missing one reads as zero). Returns the epoch last written.
local function add(key, res, size, delta, span, nothing, written)
  local epoch = math.floor(NOW / res)
  if nothing and written ~= epoch then return written end
  local offset = (epoch % size) * SLOT
  local old = redis.call('GETRANGE', key, offset, offset + SLOT - 1)
  local parts = { u32(epoch) }
  if #old == SLOT and read_u32(old, 1) == epoch then
    parts[2] = u32(span + read_u32(old, 5))
    for i = 1, SLOTTED do parts[i + 2] = u32(delta[i] + read_u32(old, 5 + 4 * i)) end
  else
    parts[2] = u32(span)
    for i = 1, SLOTTED do parts[i + 2] = u32(delta[i]) end
  end
  redis.call('SETRANGE', key, offset, table.concat(parts))
  redis.call('PEXPIRE', key, KEEP)
  for i, name in pairs(ADDED) do
    if delta[i] > 0 then
      local added, at = key .. ':' .. name, (epoch % size) * ADDED_SLOT
      local prev = redis.call('GETRANGE', added, at, at + ADDED_SLOT - 1)
      local sum = delta[i]
      if #prev == ADDED_SLOT and read_u32(prev, 1) == epoch then sum = sum + read_u32(prev, 5) end
      redis.call('SETRANGE', added, at, u32(epoch) .. u32(sum))
      redis.call('PEXPIRE', added, KEEP)
    end
  end
  return epoch
end

local function num(v) return tonumber(v) or 0 end

-- A queue's counters from its meta hash; a topic's are its own plus its subscriptions' plus those of
-- ended subscriptions, as topic_ops.stats counts them. nil when gone, or when the topic goes on in the next
-- call (`stop` set) or is left out of this pass (then true as the second value: it exists).
-- Discarded: dropped without delivery or a dead-letter queue (the console's discards): a queue's dead
-- letters discarded; a topic's, and its subscriptions' evicted (the eviction strategy) and dropped (a
-- pending-message limit of 0) too: the stats' `discards` (model.py discard_counts).
local stop = nil
local function counters(prefix, kind, k)
  if kind == 'q' then
    local m = redis.call('HMGET', prefix .. ':meta', 'uri', 'enqueued', 'dispatched', 'acked', 'redelivered',
                         'expired', 'deadlettered', 'discarded')
    if not m[1] then return nil end
    return { num(m[2]), num(m[3]), num(m[4]), num(m[5]), num(m[6]), num(m[7]), num(m[8]) }
  end
  local order = prefix .. ':sorder'
  -- dispatched, acked, redelivered, expired, deadlettered, discards of the subscriptions read
  local from, subs, last = 0, { 0, 0, 0, 0, 0, 0 }, ''
  if k == 2 and START > 0 then
    from, subs, last = START, CARRY, LAST
    if redis.call('LINDEX', order, START - 1) ~= LAST then
      return nil, redis.call('EXISTS', prefix .. ':meta') == 1
    end
  end
  local m = redis.call('HMGET', prefix .. ':meta', 'uri', 'enqueued', 'expired', 'deadlettered',
                       'ended_dispatched', 'ended_acked', 'ended_redelivered', 'ended_expired',
                       'ended_deadlettered', 'discarded', 'ended_discarded', 'ended_evicted', 'ended_dropped')
  if not m[1] then return nil end
  local count = redis.call('LLEN', order)
  local upto = math.min(count, from + budget) - 1
  if upto >= from then
    for _, key in ipairs(redis.call('LRANGE', order, from, upto)) do
      local s = redis.call('HMGET', prefix .. ':s:' .. key .. ':meta', 'dispatched', 'acked', 'redelivered',
                           'expired', 'deadlettered', 'discarded', 'evicted', 'dropped')
      for i = 1, 5 do subs[i] = subs[i] + num(s[i]) end
      subs[6] = subs[6] + num(s[6]) + num(s[7]) + num(s[8])
      last = key
    end
    budget = budget - (upto - from + 1)
  end
  if upto + 1 < count then
    stop = { k - 2, upto + 1, last, table.concat(subs, ',') }
    return nil
  end
  return { num(m[2]), subs[1] + num(m[5]), subs[2] + num(m[6]), subs[3] + num(m[7]),
           subs[4] + num(m[3]) + num(m[8]), subs[5] + num(m[4]) + num(m[9]),
           subs[6] + num(m[10]) + num(m[11]) + num(m[12]) + num(m[13]) }
end

local total = { 0, 0, 0, 0, 0, 0, 0 }
local sampled = 0
for k = 2, #KEYS do
  local prefix = KEYS[k]
  local now_c, left_out = counters(prefix, string.sub(KINDS, k - 1, k - 1), k)
  if stop then break end
  if left_out then sampled = sampled + 1 end
  if now_c then
    sampled = sampled + 1
    local state_key = prefix .. ':rates'
    local st = redis.call('HMGET', state_key, 'at', 'c', 'w5s', 'w1m', 'xsince')
    local at, written = tonumber(st[1]), { tonumber(st[3]), tonumber(st[4]) }
    local last = {}
    for v in string.gmatch(st[2] or '', '[^,]+') do last[#last + 1] = tonumber(v) end
    local state = { 'at', NOW, 'c', table.concat(now_c, ',') }
    -- a base stored before `discarded` was sampled (six counters): the others carry on, discarded's base
    -- is now, and its history starts here (xsince: rates.py reads it as absent before)
    if #last == SLOTTED then last[SERIES] = now_c[SERIES] end
    if not st[5] then state[#state + 1], state[#state + 2] = 'xsince', NOW end
    if not at or #last ~= SERIES then
      -- the first sample only sets the base: no rate, no spike
      state[#state + 1], state[#state + 2] = 'since', NOW
    elseif NOW > at then
      local delta, nothing, fell = {}, true, false
      for i = 1, SERIES do
        delta[i] = now_c[i] - last[i]
        if delta[i] < 0 then fell = true elseif delta[i] > 0 then nothing = false end
      end
      if fell then
        -- a counter went down (the destination was deleted and made again): a new base, no rate
        state[#state + 1], state[#state + 2] = 'since', NOW
      else
        local span = NOW - at
        for r, ring in ipairs(RINGS) do
          local epoch = add(prefix .. ':rates:' .. ring[1], ring[2], ring[3], delta, span, nothing, written[r])
          if epoch then state[#state + 1], state[#state + 2] = 'w' .. ring[1], epoch end
        end
        if span <= NS_GAP_MS then
          for i = 1, SERIES do total[i] = total[i] + delta[i] end
        end
      end
    end
    if NOW >= (at or 0) then
      redis.call('HSET', state_key, unpack(state))
      redis.call('PEXPIRE', state_key, KEEP)
    end
  end
end

-- The namespace's rings: this pass's deltas so far; its first call brings the pass's span.
local ns = KEYS[1]
local fields = { 'at', NOW }
local ns_since = redis.call('HMGET', ns, 'since', 'xsince')
if not ns_since[1] then fields[#fields + 1], fields[#fields + 2] = 'since', NOW end
if not ns_since[2] then fields[#fields + 1], fields[#fields + 2] = 'xsince', NOW end
local moved = PASS_SPAN > 0
for i = 1, SERIES do if total[i] > 0 then moved = true end end
if moved then
  for _, ring in ipairs(RINGS) do
    -- (a further call that lands in a new epoch writes a slot of span 0: rates.py adds it to the one before)
    add(ns .. ':' .. ring[1], ring[2], ring[3], total, PASS_SPAN, false, nil)
  end
end
redis.call('HSET', ns, unpack(fields))
if stop then return { sampled, stop[1], stop[2], stop[3], stop[4] } end
return { sampled, #KEYS - 1 }
