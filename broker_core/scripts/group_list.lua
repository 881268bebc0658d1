-- The message groups of a queue with their owners and assignment times (JMX MessageGroups, and more).
-- ARGV: now, cursor (HSCAN cursor), count. Returns {next cursor, then per group: name, owner, assigned ms}.
-- For the bucket map the names are the recently seen groups of each bucket (its LRU cache).
-- A group whose owner closed is free (its entry is deleted a chunk per call after the close): not listed.
--@include base
--@include dispatch
NOW = tonumber(ARGV[1])
local out = {}
if group_map_type() == 'bucket' then
  out[1] = '0'
  for _, gid in ipairs(redis.call('ZRANGE', K_GLRU, 0, -1)) do
    local v = redis.call('HGET', K_GROUPS, group_slot(gid))
    local owner, at = string.match(v or '', '^([^|]*)|(.*)$')
    if owner and redis.call('HEXISTS', K_CONSUMERS, owner) == 1 then
      out[#out + 1] = gid
      out[#out + 1] = owner
      out[#out + 1] = at
    end
  end
  return out
end
local page = redis.call('HSCAN', K_GROUPS, ARGV[2], 'COUNT', tonumber(ARGV[3]))
out[1] = page[1]
local items = page[2]
for i = 1, #items, 2 do
  local owner, at = string.match(items[i + 1], '^([^|]*)|(.*)$')
  if redis.call('HEXISTS', K_CONSUMERS, owner) == 1 then
    out[#out + 1] = items[i]
    out[#out + 1] = owner
    out[#out + 1] = at
  end
end
return out
