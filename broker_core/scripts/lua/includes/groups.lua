-- Message-group maps (spec §3.1): "cached" (LRU of cacheSize group ids), "simple" (unbounded) and
-- "bucket" (owners per hash bucket of the group id, so colliding groups share an owner).
-- Its module table `groups`; the lru_* fields are the cached map's per-pass state (below).
local groups = { lru_key = false, lru_clock = 0, lru_ticked = false, lru_size = false, lru_msg = false,
                 lru_stored = false, lru_slot = false, owners_gone = {} }
function groups.map_type() return base.policy()['messageGroupMapFactoryType'] end

-- java.lang.String.hashCode over UTF-16 code units, as MessageGroupHashBucket uses it.
function groups.java_hash(s)
  local h = 0
  local function add(unit) h = (h * 31 + unit) % 4294967296 end
  local i, len = 1, #s
  while i <= len do
    local b = string.byte(s, i)
    local cp, size
    if b < 0x80 then cp, size = b, 1
    elseif b < 0xE0 then cp, size = (b % 0x20) * 64 + (string.byte(s, i + 1) or 0) % 64, 2
    elseif b < 0xF0 then
      cp, size = ((b % 0x10) * 64 + (string.byte(s, i + 1) or 0) % 64) * 64 + (string.byte(s, i + 2) or 0) % 64, 3
    else
      cp = (((b % 0x08) * 64 + (string.byte(s, i + 1) or 0) % 64) * 64 + (string.byte(s, i + 2) or 0) % 64) * 64
        + (string.byte(s, i + 3) or 0) % 64
      size = 4
    end
    if cp >= 0x10000 then
      cp = cp - 0x10000
      add(0xD800 + math.floor(cp / 1024))
      add(0xDC00 + cp % 1024)
    else
      add(cp)
    end
    i = i + size
  end
  if h >= 2147483648 then h = h - 4294967296 end
  return h
end

-- The key a group is stored under: the group id itself, or its bucket for the bucket map.
function groups.slot(gid)
  if groups.map_type() == 'bucket' then
    local n = base.policy_num('groupMapBucketCount')
    return 'bucket:' .. math.abs(math.fmod(groups.java_hash(gid), n))
  end
  return gid
end

-- Within a dispatch pass (the only caller of groups.allows) the cached map's recency clock (meta 'gclock')
-- and the LRU's size are kept here, and the consumers' group counts in their tables (written by
-- flush_counts, dispatch.lua); the clock is written with the pass's state (groups.lru_flush). A message that
-- opens a group and evicts the eldest would otherwise read and write each of them once more.
-- groups.lru_msg, groups.lru_stored, groups.lru_slot: the message whose group was looked up last, the group's
-- stored value and its slot, so the candidates after the first (dispatch.lua tries each consumer in turn) do
-- not read it, or hash its name for a bucket map, again.
-- (Fields are reset to false, not nil: a field set to nil is dropped from the table by the next garbage
-- collection, and setting it again adds it anew.)
-- groups.lru_ticked: the clock's text once it moved in this pass.
function groups.lru_reset()
  groups.lru_key, groups.lru_ticked, groups.lru_size, groups.lru_msg = false, false, false, false
end
-- (at the start of every call, with owners_gone's: groups.lru_reset's work, without a call)
--@on-call
groups.lru_key, groups.lru_ticked, groups.lru_size, groups.lru_msg = false, false, false, false
if next(groups.owners_gone) ~= nil then groups.owners_gone = {} end  -- (an empty one is as good as new)
--@on-call-end
-- (The clock's text is made here, not by NOW_TEXT.num, whose last two numbers are the message's and the
-- dispatch's sequences, written again later in the call.)
function groups.lru_tick()
  if groups.lru_key ~= base.K_META then
    groups.lru_key, groups.lru_clock = base.K_META, tonumber(redis.call('HGET', base.K_META, 'gclock')) or 0
  end
  groups.lru_clock = groups.lru_clock + 1
  groups.lru_ticked = string.format('%d', groups.lru_clock)
  return groups.lru_ticked
end
-- At the end of a pass: the clock's field and value for its write of the destination's meta hash, if it
-- moved.
function groups.lru_flush(counts)
  if groups.lru_ticked then
    counts[#counts + 1] = 'gclock'
    counts[#counts + 1] = groups.lru_ticked
  end
  groups.lru_reset()
end

-- A group of consumer `cid` went away: counted down in its table when it is one of the pass's consumers
-- `cons` (flush_counts writes the count), else in Redis, if the consumer is still there.
function groups.count_down(cid, cons)
  for i = 1, #cons do
    local c = cons[i]
    if c.id == cid then
      consumers.counted(c)
      c.groups = c.groups - 1
      consumers.groups_moved(c)
      return
    end
  end
  if redis.call('HEXISTS', base.K_CONSUMERS, cid) == 1 then
    redis.call('HINCRBY', base.K_C(cid), 'groups', -1)
    consumers.unordered()  -- (consumers.lua join_order)
  end
end

-- Assign group `gid` (stored under `slot`, whose stored value was `previous`) to consumer c, one of the
-- pass's consumers `cons`. `orphan`: the previous owner is closed (its entry was not deleted yet).
function groups.assign(gid, slot, previous, c, cons, orphan)
  if previous then
    -- Re-binding (JMSXGroupSeq 1) moves the group; like ActiveMQ the old owner's count is not decremented.
    -- Messages of the group skipped earlier in this pass may now go to the new owner (an orphan's were
    -- not skipped: the pass restarted when its owner closed).
    redis.call('SREM', base.K_CGRP(groups.owner_of(previous)), slot)
    if not orphan then message.mark_dirty() end
  end
  redis.call('HSET', base.K_GROUPS, slot, c.id .. '|' .. base.NOW)
  redis.call('SADD', base.K_CGRP(c.id), slot)
  c.groups = c.groups + 1
  consumers.groups_moved(c)
  local kind = groups.map_type()
  if kind == 'cached' then
    local size = base.policy_num('groupMapCacheSize')
    if not groups.lru_size then groups.lru_size = redis.call('ZCARD', base.K_GLRU) end
    groups.lru_size = groups.lru_size + redis.call('ZADD', base.K_GLRU, groups.lru_tick(), slot)
    while groups.lru_size > size do
      local eldest = redis.call('ZPOPMIN', base.K_GLRU)[1]
      groups.lru_size = groups.lru_size - 1
      local v = redis.call('HGET', base.K_GROUPS, eldest)
      redis.call('HDEL', base.K_GROUPS, eldest)
      if v then
        local owner = groups.owner_of(v)
        redis.call('SREM', base.K_CGRP(owner), eldest)
        groups.count_down(owner, cons)
        message.mark_dirty()
        base.emit('group_evict', 'group', eldest, 'consumer', owner)
      end
    end
  elseif kind == 'bucket' then
    -- The bucket map only remembers recent group names, for listing (JMX MessageGroups).
    redis.call('ZADD', base.K_GLRU, groups.lru_tick(), gid)
    local size = base.policy_num('groupMapCacheSize')
    if size and redis.call('ZCARD', base.K_GLRU) > size then redis.call('ZPOPMIN', base.K_GLRU) end
  end
  base.emit('group_assign', 'group', gid, 'consumer', c.id)
end

function groups.remove_slot(slot)
  local v = redis.call('HGET', base.K_GROUPS, slot)
  if not v then return nil end
  local owner = groups.owner_of(v)
  redis.call('HDEL', base.K_GROUPS, slot)
  redis.call('SREM', base.K_CGRP(owner), slot)
  if groups.map_type() == 'cached' then
    local removed = redis.call('ZREM', base.K_GLRU, slot)
    if groups.lru_size then groups.lru_size = groups.lru_size - removed end
  end
  return owner
end

-- Has consumer `cid`, the owner of a group, closed? (once per owner and call: groups.owners_gone, reset above)
function groups.owner_gone(cid)
  local gone = groups.owners_gone[cid]
  if gone == nil then
    gone = redis.call('HEXISTS', base.K_CONSUMERS, cid) == 0
    groups.owners_gone[cid] = gone
  end
  return gone
end

-- The stored value ('<owner>|<since>', or false) of the group (`gid`, stored under `slot`) of message `id`
-- (sequence `seq`), as the pass's offers of the message find it: read once per message, the cached map's
-- access order moved once per message (LinkedHashMap.get: ActiveMQ's get for each consumer offered the
-- message moves the same entry to the same end), kept for the candidates after the first. `v`: the value,
-- when the caller has read it (groups.peek).
function groups.stored(id, gid, seq, slot, v)
  if groups.lru_msg == id then return groups.lru_stored, groups.lru_slot end
  slot = slot or groups.slot(gid)
  if v == nil then v = redis.call('HGET', base.K_GROUPS, slot) end
  groups.lru_msg, groups.lru_stored, groups.lru_slot = id, v, slot
  if v and seq ~= 1 and groups.map_type() == 'cached' then
    redis.call('ZADD', base.K_GLRU, groups.lru_tick(), slot)  -- LinkedHashMap access order
  end
  return v, slot
end

-- The owner's consumer id in a group's stored value ('<consumer id>|<assigned at>', groups.assign).
function groups.owner_of(v)
  return string.match(v, '^([^|]*)')
end

-- The stored value of group `gid` and its slot, read without what an offer does (groups.stored): for the
-- dispatch pass's question whether a message needs its walk at all (dispatch.lua, `blocked`).
function groups.peek(gid)
  local slot = groups.slot(gid)
  return redis.call('HGET', base.K_GROUPS, slot), slot
end

-- Queue.assignMessageGroup for the candidate consumer c (after selector and exclusivity passed); called by
-- the dispatch pass only (its consumers `cons`), which ends with groups.lru_flush. Returns whether c may have the
-- message and, second, whether it is the first of its group for c (JMSXGroupFirstForConsumer: the pass
-- records it in K_GFIRST as it delivers).
function groups.allows(c, id, gid, seq, cons)
  if gid == nil or gid == false then return true end  -- '' is a group, as in ActiveMQ
  if base.SUB then return true end  -- message groups are a queue's (§3.3); a subscription has none
  local v, slot = groups.stored(id, gid, seq)
  local owner = v and groups.owner_of(v)
  -- An owner that is no consumer any more closed: its group is free (close_consumer leaves the entries
  -- to be deleted a chunk per call, lifecycle.lua free_groups). Its id stays listed as closing until
  -- then, so no new consumer has it.
  local orphan = owner and owner ~= c.id and groups.owner_gone(owner)
  if seq == 1 or not v or orphan then
    groups.lru_msg = false
    groups.assign(gid, slot, v, c, cons, orphan)
    return true, true
  end
  if owner == c.id then
    if seq < 0 then
      groups.lru_msg = false
      groups.remove_slot(slot)
      c.groups = c.groups - 1
      consumers.groups_moved(c)
      message.mark_dirty()
      base.emit('group_close', 'group', gid, 'consumer', c.id)
    end
    return true
  end
  return false
end
