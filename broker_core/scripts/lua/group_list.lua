-- The message groups of a queue with their owners and assignment times (JMX MessageGroups, and more).
-- ARGV: now, cursor ('0' to start), count. Returns {next cursor ('0' when done), then per group: name, owner,
-- assigned ms}: a page of about `count` groups (HSCAN's; the bucket map: its LRU cache of recently seen
-- group names, by rank). A group whose owner closed is free (its entry is deleted a chunk per call after the
-- close): not listed.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local out = {}
if groups.map_type() == 'bucket' then
  local from, count = tonumber(ARGV[2]) or 0, tonumber(ARGV[3])
  local names = redis.call('ZRANGE', base.K_GLRU, from, from + count - 1)
  out[1] = #names == count and tostring(from + count) or '0'
  for _, gid in ipairs(names) do
    local v = redis.call('HGET', base.K_GROUPS, groups.slot(gid))
    local owner, at = string.match(v or '', '^([^|]*)|(.*)$')
    if owner and redis.call('HEXISTS', base.K_CONSUMERS, owner) == 1 then
      out[#out + 1] = gid
      out[#out + 1] = owner
      out[#out + 1] = at
    end
  end
  return out
end
local page = redis.call('HSCAN', base.K_GROUPS, ARGV[2], 'COUNT', tonumber(ARGV[3]))
out[1] = page[1]
local items = page[2]
for i = 1, #items, 2 do
  local owner, at = string.match(items[i + 1], '^([^|]*)|(.*)$')
  if redis.call('HEXISTS', base.K_CONSUMERS, owner) == 1 then
    out[#out + 1] = items[i]
    out[#out + 1] = owner
    out[#out + 1] = at
  end
end
return out
