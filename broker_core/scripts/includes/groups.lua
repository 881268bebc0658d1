-- Message-group maps (spec §3.1): "cached" (LRU of cacheSize group ids), "simple" (unbounded) and
-- "bucket" (owners per hash bucket of the group id, so colliding groups share an owner).
local function group_map_type() return policy()['messageGroupMapFactoryType'] end

-- java.lang.String.hashCode over UTF-16 code units, as MessageGroupHashBucket uses it.
local function java_hash(s)
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
local function group_slot(gid)
  if group_map_type() == 'bucket' then
    local n = policy_num('groupMapBucketCount')
    return 'bucket:' .. math.abs(math.fmod(java_hash(gid), n))
  end
  return gid
end

local function group_owner(gid)
  local slot = group_slot(gid)
  local v = redis.call('HGET', K_GROUPS, slot)
  if not v then return nil end
  if group_map_type() == 'cached' then
    redis.call('ZADD', K_GLRU, meta_incr('gclock'), slot)  -- LinkedHashMap access order
  end
  return string.match(v, '^([^|]*)')
end

local function adjust_group_count(cid, by)
  if redis.call('HEXISTS', K_CONSUMERS, cid) == 1 then redis.call('HINCRBY', K_C(cid), 'groups', by) end
end

local function group_assign(gid, c)
  local slot = group_slot(gid)
  local previous = redis.call('HGET', K_GROUPS, slot)
  if previous then
    -- Re-binding (JMSXGroupSeq 1) moves the group; like ActiveMQ the old owner's count is not decremented.
    -- Messages of the group skipped earlier in this pass may now go to the new owner.
    redis.call('SREM', K_CGRP(string.match(previous, '^([^|]*)')), slot)
    mark_dirty()
  end
  redis.call('HSET', K_GROUPS, slot, c.id .. '|' .. NOW)
  redis.call('SADD', K_CGRP(c.id), slot)
  c.groups = redis.call('HINCRBY', K_C(c.id), 'groups', 1)
  local kind = group_map_type()
  if kind == 'cached' then
    redis.call('ZADD', K_GLRU, meta_incr('gclock'), slot)
    local size = policy_num('groupMapCacheSize')
    while redis.call('ZCARD', K_GLRU) > size do
      local eldest = redis.call('ZPOPMIN', K_GLRU)[1]
      local v = redis.call('HGET', K_GROUPS, eldest)
      redis.call('HDEL', K_GROUPS, eldest)
      if v then
        local owner = string.match(v, '^([^|]*)')
        redis.call('SREM', K_CGRP(owner), eldest)
        adjust_group_count(owner, -1)
        mark_dirty()
        emit('group_evict', 'group', eldest, 'consumer', owner)
      end
    end
  elseif kind == 'bucket' then
    -- The bucket map only remembers recent group names, for listing (JMX MessageGroups).
    redis.call('ZADD', K_GLRU, meta_incr('gclock'), gid)
    local size = policy_num('groupMapCacheSize')
    if size and redis.call('ZCARD', K_GLRU) > size then redis.call('ZPOPMIN', K_GLRU) end
  end
  emit('group_assign', 'group', gid, 'consumer', c.id)
end

local function group_remove_slot(slot)
  local v = redis.call('HGET', K_GROUPS, slot)
  if not v then return nil end
  local owner = string.match(v, '^([^|]*)')
  redis.call('HDEL', K_GROUPS, slot)
  redis.call('SREM', K_CGRP(owner), slot)
  if group_map_type() == 'cached' then redis.call('ZREM', K_GLRU, slot) end
  return owner
end

-- Queue.assignMessageGroup for the candidate consumer c (after selector and exclusivity passed).
local function group_allows(c, id, gid, seq)
  if gid == nil or gid == false then return true end  -- '' is a group, as in ActiveMQ
  if SUB then return true end  -- message groups are a queue's (§3.3); a subscription has none
  if seq == 1 then
    group_assign(gid, c)
    redis.call('SADD', K_GFIRST, id)
    return true
  end
  local owner = group_owner(gid)
  if owner == nil then
    group_assign(gid, c)
    redis.call('SADD', K_GFIRST, id)
    return true
  end
  if owner == c.id then
    if seq < 0 then
      group_remove_slot(group_slot(gid))
      c.groups = redis.call('HINCRBY', K_C(c.id), 'groups', -1)
      mark_dirty()
      emit('group_close', 'group', gid, 'consumer', c.id)
    end
    return true
  end
  return false
end
