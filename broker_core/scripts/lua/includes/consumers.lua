-- Consumers as the dispatch loop sees them, their prefetch windows and their order (spec §1.3-1.5).

-- Its module table is `consumers`. Per call (reset with gmap's, below): slow_rule, note_slow's rule for
-- the current prefix and whether it defers its writes (dispatch.lua sets `defer` during a pass).
local consumers = { slow_rule = { prefix = nil, topic = false, defer = false }, gmap = false, gone = false,
                    defs = { n = 0, by_packed = {} } }

-- Consumer definitions are kept decoded under their packed form (as base.lua keeps policies): a script call
-- reads the same definition more than once (the acked consumer, then the dispatch chunk's consumers),
-- and, where the library outlives a call, every call reads them. Nothing writes into these.
function consumers.def(packed)
  local defs = consumers.defs
  local def = defs.by_packed[packed]
  if def == nil then
    def = cmsgpack.unpack(packed)
    if defs.n >= 1024 then defs.n, defs.by_packed = 0, {} end
    defs.n = defs.n + 1
    defs.by_packed[packed] = def
  end
  return def
end

-- (a consumer's hash; 'push' and 'rcv' for pushed deliveries, outbox.lua)
consumers.COUNTERS = { 'n', 'ext', 'groups', 'prefetch', 'dispatched', 'slow_since', 'push', 'rcv' }
-- find_consumer's: COUNTERS, then what the ack path also reads
-- (made with plain indexing: registering the function library failed with unpack called here, 'nonexistent
-- global variable')
consumers.COUNTERS_FOR_ACK = {}
for i = 1, #consumers.COUNTERS do consumers.COUNTERS_FOR_ACK[i] = consumers.COUNTERS[i] end
consumers.COUNTERS_FOR_ACK[#consumers.COUNTERS + 1] = 'acked'  -- (counters[9])

-- The counters of consumer c from `counters` (HMGET of COUNTERS, then whatever else the caller asked for).
function consumers.read_counters(c, counters)
  -- (`x and (N[x] or tonumber(x)) or 0`: no call into C for an unset field, nor for a small number
  -- (base.NUMBERS))
  local N = base.NUMBERS
  local n, ext, groups, prefetch = counters[1], counters[2], counters[3], counters[4]
  c.n, c.ext = n and (N[n] or tonumber(n)) or 0, ext and (N[ext] or tonumber(ext)) or 0
  c.groups = groups and (N[groups] or tonumber(groups)) or 0
  c.prefetch = prefetch and (N[prefetch] or tonumber(prefetch)) or 0
  local dispatched, push, rcv = counters[5], counters[7], counters[8]
  c.dispatched, c.slow = dispatched and (N[dispatched] or tonumber(dispatched)) or 0, counters[6] ~= false
  c.push, c.rcv = push and (N[push] or tonumber(push)) or 0, rcv and (N[rcv] or tonumber(rcv)) or 0
  c.loaded = true
end

-- A consumer from its stored definition, whether its lease runs, and, unless they are read later
-- (`counters` nil: counted), its counters.
function consumers.load_one(cid, packed, counters, alive)
  local def = consumers.def(packed)  -- decoded once
  local c = {
    id = cid, def = def, priority = tonumber(def.priority) or 0, alive = alive, expr = nil,
    groups_moved = false,  -- (groups.lua; flush_counts writes the count when true)
    loaded = false,
    -- (named so the table is made with room for them; read_counters sets them)
    n = nil, ext = nil, groups = nil, prefetch = nil, dispatched = nil, slow = nil, push = nil, rcv = nil,
  }
  if counters then consumers.read_counters(c, counters) end
  return c
end

-- Consumer c with its counters, read now if load_consumers(true) left them for later.
function consumers.counted(c)
  if not c.loaded then consumers.read_counters(c, redis.call('HMGET', base.K_C(c.id), unpack(consumers.COUNTERS))) end
  return c
end

-- The consumers whose lease runs to NOW or later (a set of their ids), read by name: their scores would
-- come back as text that Redis formats and Lua parses again, which costs more than the rest of a consumer's
-- loading.
function consumers.live_leases()
  local live = redis.call('ZRANGEBYSCORE', base.K_LEASES, base.NOW_TEXT.get(), '+inf')
  local alive = {}
  for k = 1, #live do alive[live[k]] = true end
  return alive
end

-- The dispatch pass's consumers (load_consumers(true)): the order is read at once, a consumer's definition
-- and lease when the pass first looks at its priority, `alive` or `def` (a metatable reads them on that
-- first access). A message usually goes to the first consumer in the order, so a pass over a queue with many
-- consumers reads one definition and one lease, not all of them (each consumer read costs the script about
-- 13 k Redis instructions: docs/benchmarks.md, "Session 9"). Once a second one is needed, all the others not
-- read yet are read together, one command per key, as load_consumers does.
consumers.DEF_NONE = {}  -- (the definition of a consumer gone from the destination: never alive)
-- consumers.gone.any: this call found such a consumer (save_order then leaves it out).
-- (reset per call with gmap's, below)
consumers.gone = { any = false }
function consumers.lazy_load(ids, known, out)
  local waiting, read_one, mt = {}, false, {}
  local function define(c, packed, alive)
    setmetatable(c, nil)
    local def = packed and consumers.def(packed) or consumers.DEF_NONE
    if not packed then consumers.gone.any = true end
    c.def, c.priority, c.alive = def, tonumber(def.priority) or 0, packed and alive or false
  end
  mt.__index = function(c, key)
    if key ~= 'def' and key ~= 'alive' and key ~= 'priority' then return nil end
    if not read_one then
      read_one = true
      local packed = redis.call('HGET', base.K_CONSUMERS, c.id)
      local lease = packed and redis.call('ZSCORE', base.K_LEASES, c.id)
      define(c, packed, lease and tonumber(lease) >= base.NOW)
    else
      local rest, names = {}, {}
      for i = 1, #waiting do
        local s = waiting[i]
        if rawget(s, 'def') == nil then rest[#rest + 1], names[#names + 1] = s, s.id end
      end
      local defs = base.call_many('HMGET', base.K_CONSUMERS, names)  -- (unpack's limit: about 8,000)
      local alive = consumers.live_leases()
      for i = 1, #rest do define(rest[i], defs[i], alive[rest[i].id] == true) end
    end
    return rawget(c, key)
  end
  for k = 1, #ids do
    local cid = ids[k]
    local c = known and known[cid]
    if not c then
      c = setmetatable({ id = cid, groups_moved = false, loaded = false }, mt)
      waiting[#waiting + 1] = c
    end
    out[#out + 1] = c
  end
  return out
end

-- Every consumer of the destination, in the stored dispatch order. Consumers the script has read already
-- and kept current (`known`: consumer id -> its table, of the current prefix; ack.lua's, passed through
-- its dispatch chunk) are not read again: those tables are used. With `lazy` (the dispatch pass) a consumer's counters are read when first needed (counted), and
-- where there are several consumers, its definition and lease too (lazy_consumers): a message offered to the
-- first consumer in the order reads that consumer's alone.
function consumers.load(lazy, known)
  local ids = redis.call('LRANGE', base.K_CORDER, '0', '-1')
  local out = { nil }  -- (made with room for one: a table that grows is rebuilt at each power of two)
  if #ids == 0 then return out end
  if lazy and #ids > 1 then return consumers.lazy_load(ids, known, out) end
  local ask = ids
  if known then
    ask = {}
    for k = 1, #ids do
      if not known[ids[k]] then ask[#ask + 1] = ids[k] end
    end
  end
  local defs, alive = nil, nil  -- (read only for the consumers asked for)
  if #ask > 0 then
    defs = base.call_many('HMGET', base.K_CONSUMERS, ask)  -- (unpack's limit: about 8,000)
    alive = consumers.live_leases()
  end
  local i = 0
  for k = 1, #ids do
    local cid = ids[k]
    local mine = known and known[cid]
    if mine then
      out[#out + 1] = mine
    else
      i = i + 1
      if defs[i] then
        local counters = not lazy and redis.call('HMGET', base.K_C(cid), unpack(consumers.COUNTERS)) or nil
        out[#out + 1] = consumers.load_one(cid, defs[i], counters, alive[cid] == true)
      end
    end
  end
  return out
end

-- One consumer; its `rcv` (outbox.lua) and `acked` counters come in the same read, for the ack path.
-- Second: its lease's end as stored (false: none), for a renewal in the same call (renew_lease).
function consumers.find(cid)
  local packed = redis.call('HGET', base.K_CONSUMERS, cid)
  if not packed then return nil end
  local counters = redis.call('HMGET', base.K_C(cid), unpack(consumers.COUNTERS_FOR_ACK))
  local lease = redis.call('ZSCORE', base.K_LEASES, cid)
  local c = consumers.load_one(cid, packed, counters, lease ~= false and tonumber(lease) >= base.NOW)
  c.acked = counters[9] and base.number(counters[9]) or 0
  return c, lease
end

-- PrefetchSubscription.isFull: the window is the prefetch plus the DELIVERED-ack extension;
-- a prefetch of 0 (pull) has room only while a receive call has asked for messages.
-- How many more messages consumer c's window takes (prefetch 0: the receives waiting for one).
function consumers.free_slots(c)
  if not c.loaded then consumers.counted(c) end
  if c.prefetch == 0 then return c.ext end
  local ext = c.ext
  if ext ~= 0 and not base.policy_flag('usePrefetchExtension') then ext = 0 end
  return c.prefetch + ext - c.n
end
function consumers.is_full(c) return consumers.free_slots(c) <= 0 end

-- §8.1: a consumer the queue tries to dispatch to while its window is full is slow (once, with the
-- time); one found with room is not slow any more.
-- a non-durable topic subscription is marked slow by the topic's rule instead (§8.1: more than
-- its prefetch waiting beyond a full window; includes/topic.lua), so the queue rule leaves it alone.
function consumers.note_slow(c, full)
  local rule = consumers.slow_rule
  if rule.prefix ~= base.P then
    rule.prefix = base.P
    rule.topic = base.SUB ~= nil and redis.call('HGET', base.K_META, 'durable') ~= '1'
  end
  if rule.topic then return end
  if not c.loaded then consumers.counted(c) end
  if full == c.slow then return end  -- (slow and found full, or not slow and found with room: no change)
  -- During a dispatch pass (consumers.slow_rule.defer) the field is written once, with the consumer's counters at
  -- the end of the pass (dispatch.lua flush_counts; nothing reads it in between): c.slow_write, true to
  -- set it to NOW, false to delete it.
  if full and not c.slow then
    c.slow = true
    if consumers.slow_rule.defer then
      c.slow_write = true
    else
      redis.call('HSET', base.K_C(c.id), 'slow_since', base.NOW_TEXT.get())
    end
    base.emit('slow', 'consumer', c.id)
  elseif not full and c.slow then
    c.slow = false
    if consumers.slow_rule.defer then c.slow_write = false else redis.call('HDEL', base.K_C(c.id), 'slow_since') end
  end
end

-- Whether the destination has a message-group map yet (meta 'gmap'): read once per script call (and
-- per prefix: a topic send switches subscriptions), not once per dispatched message.
consumers.gmap = { key = nil, on = false, cprio_key = nil, cprio = nil }
-- (the module's per-call state, reset at the start of every call)
--@on-call
do
  local gmap, rule = consumers.gmap, consumers.slow_rule
  gmap.key, gmap.on, gmap.cprio_key = nil, false, nil
  rule.prefix, rule.topic, rule.defer = nil, false, false
end
consumers.gone.any = false
consumers.order_kept.cleared = nil
-- (an empty one is as good as a new one: a table made per call costs its making and its collection)
if next(consumers.order_kept.stale) ~= nil then consumers.order_kept.stale = {} end
--@on-call-end
function consumers.gmap.exists()
  if consumers.gmap.key ~= base.K_META then consumers.gmap.key, consumers.gmap.on = base.K_META, redis.call('HGET', base.K_META, 'gmap') == '1' end
  return consumers.gmap.on
end
function consumers.gmap.create()
  if not consumers.gmap.exists() then
    -- (the group counts become a key of the order, all 0 still: groups are assigned only once there is a
    -- map, so a sorted order stays sorted)
    redis.call('HSET', base.K_META, 'gmap', '1')
    consumers.gmap.on = true
  end
end

-- Whether every consumer of the destination has the same priority (meta 'cprio': that priority, or
-- 'mixed'): then ordering by priority changes nothing, and the dispatch pass need not read every consumer's
-- definition to keep its order (lazy_consumers). consumer_add, which reads them all, writes it; whatever
-- else changes the consumers (a subscription's consumer, a close) deletes it, and the next sort works it out
-- again from the consumers it has.
function consumers.gmap.one_priority(cons)
  if consumers.gmap.cprio_key ~= base.K_META then
    consumers.gmap.cprio_key, consumers.gmap.cprio = base.K_META, redis.call('HGET', base.K_META, 'cprio')
    if not consumers.gmap.cprio then consumers.gmap.note_priorities(cons) end
  end
  return consumers.gmap.cprio ~= 'mixed'
end
function consumers.gmap.note_priorities(cons)
  if #cons == 0 then return end
  local first, value = cons[1].priority, nil
  for i = 2, #cons do
    if cons[i].priority ~= first then value = 'mixed' break end
  end
  consumers.gmap.cprio_key, consumers.gmap.cprio = base.K_META, value or string.format('%d', first)
  redis.call('HSET', base.K_META, 'cprio', consumers.gmap.cprio)
end
function consumers.gmap.forget_priorities()
  redis.call('HDEL', base.K_META, 'cprio')
  consumers.gmap.cprio_key = nil
end

-- Stable sort by priority (descending) and, once the queue has a group map, by the number of
-- groups assigned (ascending); equal keys keep their current order (Collections.sort is stable).
-- Returns how many consumers it walked (0 when every key is equal: the order stands), which the dispatch
-- pass counts against its work budget (dispatch.lua dispatch.CONSUMER_STEPS).
function consumers.sort(cons)
  if not base.policy_flag('useConsumerPriority') then
    consumers.unordered()  -- (a rotation leaves the order unsorted)
    return 0
  end
  local by_groups = consumers.gmap.exists()
  local by_priority = not consumers.gmap.one_priority(cons)
  consumers.order_kept.stale[base.K_META] = nil  -- (`cons` is every consumer: sorted below, counts as they are)
  if not (by_groups or by_priority) then return 0 end  -- every key is equal: the order stands
  if by_groups then  -- (the group count alone of a consumer not read yet: counted reads the rest if needed)
    for i = 1, #cons do
      local c = cons[i]
      if c.groups == nil then c.groups = tonumber(redis.call('HGET', base.K_C(c.id), 'groups')) or 0 end
    end
  end
  local function before(a, b)
    if by_priority and a.priority ~= b.priority then return a.priority > b.priority end
    if by_groups and a.groups ~= b.groups then return a.groups < b.groups end
    return false
  end
  for i = 2, #cons do
    local c = cons[i]
    local j = i - 1
    while j >= 1 and before(c, cons[j]) do
      cons[j + 1] = cons[j]
      j = j - 1
    end
    cons[j + 1] = c
  end
  return #cons
end

-- (an id whose consumer is gone from the destination, found by lazy_consumers, is left out, as
-- load_consumers leaves it out of what it reads: every script writes the two keys together, so only a store
-- changed outside the scripts has one)
function consumers.save_order(cons)
  redis.call('DEL', base.K_CORDER)
  local ids = {}
  for i = 1, #cons do
    local c = cons[i]
    if not consumers.gone.any or rawget(c, 'def') ~= consumers.DEF_NONE then ids[#ids + 1] = c.id end
  end
  base.call_many('RPUSH', base.K_CORDER, ids)
end

function consumers.selector_of(c)
  if c.expr == nil then
    local compiled = c.def.selector
    if type(compiled) == 'string' and compiled ~= '' then c.expr = cjson.decode(compiled) else c.expr = false end
  end
  return c.expr
end

-- A queue consumer's add without reading the others (consumer_add.lua; docs/broker_core.md "Dispatch").
-- Two things are kept as consumers come and go, so the newcomer's place in the order and meta 'cprio' come
-- from a few reads, whatever the number of consumers:
--   <P>:prios, a hash: priority -> how many of the queue's consumers have it (consumer_add adds one,
--     lifecycle.lua close_consumer takes one away; at most 256 fields, the priorities -128..127);
--   meta 'ordered' ('1'): the stored order is sorted as consumers.sort sorts it, with the group counts as
--     stored. Whatever may leave it unsorted deletes it (consumers.unordered): a group count written
--     (dispatch.lua flush_consumer, groups.lua, group_reset.lua), a rotation while useConsumerPriority is
--     off.
-- Without both (data written before they were kept, or after any of those) the add reads every consumer and
-- sorts them all, as ActiveMQ's Queue.addToConsumerList does, and keeps both again from there.
-- Per call: `cleared`, the meta key whose 'ordered' this call deleted; `stale`, meta key -> true for a
-- destination some of whose consumers' group counts this call changed since it last sorted them all (the
-- dispatch pass sorts them after each delivery to rotate them, so a count changed there is usually sorted
-- by the time it is written).
consumers.order_kept = { cleared = nil, stale = {} }
function consumers.prios_key() return base.P .. ':prios' end
function consumers.priority_name(priority) return string.format('%d', priority) end

function consumers.unordered()
  if consumers.order_kept.cleared == base.K_META then return end
  consumers.order_kept.cleared = base.K_META
  redis.call('HDEL', base.K_META, 'ordered')
end
function consumers.ordered()
  redis.call('HSET', base.K_META, 'ordered', '1')
  consumers.order_kept.cleared = nil
end
-- Consumer c's group count changed (in its table; written at the end of the pass).
function consumers.groups_moved(c)
  c.groups_moved = true
  consumers.order_kept.stale[base.K_META] = true
end
-- A consumer's group count is written: the order is unsorted unless it was sorted since the count changed.
function consumers.groups_written()
  if consumers.order_kept.stale[base.K_META] then consumers.unordered() end
end

-- A consumer of `priority` left the queue (lifecycle.lua close_consumer).
function consumers.priority_left(priority)
  local key = consumers.prios_key()
  if redis.call('HINCRBY', key, consumers.priority_name(priority), -1) <= 0 then
    redis.call('HDEL', key, consumers.priority_name(priority))
  end
end

-- The kept priority counts (priority number -> count) when they account for all `count` consumers, else nil.
function consumers.priority_counts(count)
  local flat = redis.call('HGETALL', consumers.prios_key())
  local counts, sum = {}, 0
  for i = 1, #flat, 2 do
    local n = tonumber(flat[i + 1])
    counts[tonumber(flat[i])] = n
    sum = sum + n
  end
  if sum ~= count then return nil end
  return counts
end

-- meta 'cprio' from the counts (what note_priorities works out from every consumer).
function consumers.note_counts(counts)
  local only, distinct = nil, 0
  for priority in pairs(counts) do only, distinct = priority, distinct + 1 end
  consumers.gmap.cprio_key = base.K_META
  consumers.gmap.cprio = distinct == 1 and consumers.priority_name(only) or 'mixed'
  redis.call('HSET', base.K_META, 'cprio', consumers.gmap.cprio)
end

function consumers.group_count(index)
  local cid = redis.call('LINDEX', base.K_CORDER, index)
  return tonumber(redis.call('HGET', base.K_C(cid), 'groups')) or 0
end

-- Where a stable sort puts a newcomer of `priority` with no groups, appended after the `count` consumers of
-- a sorted order: after every consumer of a higher priority, and of its own priority after those with no
-- more groups than it (a binary search of its band: log2 of the band's size group counts read).
function consumers.place(priority, counts, count)
  local by_priority = consumers.gmap.cprio == 'mixed'
  local by_groups = consumers.gmap.exists()
  if not (by_priority or by_groups) then return count end
  local lo, hi = 0, count
  if by_priority then
    lo = 0
    for p, n in pairs(counts) do
      if p > priority then lo = lo + n end
    end
    hi = lo + (counts[priority] or 0) - 1  -- (the counts include the newcomer)
  end
  if not by_groups then return hi end
  while lo < hi do  -- the first of the band with more groups than none
    local mid = math.floor((lo + hi) / 2)
    if consumers.group_count(mid) > 0 then hi = mid else lo = mid + 1 end
  end
  return lo
end

-- Put queue consumer `cid` of `priority`, just registered, into the dispatch order, the `count` consumers
-- already there staying in order; meta 'cprio' and the kept counts follow (see above).
function consumers.join_order(cid, priority, count)
  local counts = consumers.priority_counts(count)
  local kept = counts ~= nil and redis.call('HGET', base.K_META, 'ordered') == '1'
    and redis.call('LLEN', base.K_CORDER) == count
  if not kept then
    redis.call('RPUSH', base.K_CORDER, cid)
    local cons = consumers.load()
    consumers.gmap.note_priorities(cons)
    consumers.sort(cons)
    consumers.save_order(cons)
    local fields = {}
    for i = 1, #cons do
      local name = consumers.priority_name(cons[i].priority)
      fields[name] = (fields[name] or 0) + 1
    end
    local flat = {}
    for name, n in pairs(fields) do flat[#flat + 1], flat[#flat + 2] = name, n end
    redis.call('DEL', consumers.prios_key())
    if #flat > 0 then redis.call('HSET', consumers.prios_key(), unpack(flat)) end
    if base.policy_flag('useConsumerPriority') then consumers.ordered() end
    return
  end
  redis.call('HINCRBY', consumers.prios_key(), consumers.priority_name(priority), 1)
  counts[priority] = (counts[priority] or 0) + 1
  consumers.note_counts(counts)
  if not base.policy_flag('useConsumerPriority') then
    redis.call('RPUSH', base.K_CORDER, cid)
    consumers.unordered()
    return
  end
  local at = consumers.place(priority, counts, count)
  if at >= count then
    redis.call('RPUSH', base.K_CORDER, cid)
  else
    redis.call('LINSERT', base.K_CORDER, 'BEFORE', redis.call('LINDEX', base.K_CORDER, at), cid)
  end
end
