-- The connection registry (broker_core/connections.py): which client connections the gateway processes
-- hold, with their subscriptions and producers, for the console's Connections page, and the close
-- requests an operator sends to the process that owns a connection.
--
-- KEYS[1] = the registry's prefix R = <ns>:{conns}. Keys under it:
--   R:ids          sorted set, every score 0: the connection ids, in id order (the listing's cursor)
--   R:lease        sorted set: connection id -> lease expiry (ms, the caller's clock)
--   R:c:<id>       hash: the connection's fields (protocol, client, user, address, since, process, ...)
--   R:s:<id>       hash: subscription key -> its JSON (destination, ack mode, selector, prefetch, consumers)
--   R:p:<id>       hash: destination -> "<count>|<last send ms>" (what this connection sent)
--   R:d:<id>       hash: destination -> "s", "p" or "sp" (what the destination filter looks at)
--   R:close:<process>  set: connections an operator asked that process to close
--   R:total        string: connections registered since the registry began (a connection whose lease lapsed
--                  and that registers again counts again): ActiveMQ's BrokerView TotalConnectionsCount
-- Each connection's keys carry a PEXPIRE of its lease too (Redis's clock), so the keys of a connection
-- whose process died go away even when nobody lists; the lease set is what the answers are judged by.
--
-- ARGV: now, op, then per op:
--   put json          -> 1 (updated), 2 (created: the caller writes the whole record next time) or an
--                        error REGISTRY_FULL when a new connection would exceed the limit.
--                        json = {id, lease, limit, create (bool), set {field: value}, sub_set {key: json},
--                        sub_del [key], prod_set {dest: value}, dest_set {dest: roles}, dest_del [dest]}
--   renew lease id...  -> the ids that are not registered (lapsed and purged): the caller puts them again
--   drop id...         -> how many were registered
--   list cursor count filters_json -> {next cursor ('' at the end), examined, then per match {id, fields
--                        (flat), subscription count, producer count[, destinations when
--                        filters.with_destinations]}}; at most `count` ids are examined per call
--                        (lapsed ones purged on the way), so a page may hold fewer matches than `count`
--   get id            -> {fields, subscriptions (flat), producers (flat)} or false
--   close id reason   -> {process, protocol} of a live connection, asked to close; false if none
--   take process count -> up to `count` {connection id, reason} the process was asked to close
-- Allowed past maxmemory (--@allow-oom): a consumer that connects to drain a full broker registers here,
-- and a refusal would refuse the connection; an entry is a few hundred bytes, bounded by the limit.
--@allow-oom
local R = KEYS[1]
local NOW = tonumber(ARGV[1])
local op = ARGV[2]
local K_IDS, K_LEASE = R .. ':ids', R .. ':lease'
local PURGE_PER_CALL = 100  -- lapsed connections removed by one register (bounded work per call)

local function keys_of(id)
  return R .. ':c:' .. id, R .. ':s:' .. id, R .. ':p:' .. id, R .. ':d:' .. id
end

local function purge(id)
  redis.call('ZREM', K_IDS, id)
  redis.call('ZREM', K_LEASE, id)
  local c, s, p, d = keys_of(id)
  redis.call('DEL', c, s, p, d)
end

local function live(id)
  local expires = redis.call('ZSCORE', K_LEASE, id)
  return expires and tonumber(expires) > NOW
end

local function expire_all(id, lease)
  local c, s, p, d = keys_of(id)
  for _, key in ipairs({c, s, p, d}) do redis.call('PEXPIRE', key, lease) end
end

if op == 'put' then
  local a = cjson.decode(ARGV[3])
  local id, lease = a.id, tonumber(a.lease)
  local c, s, p, d = keys_of(id)
  local result = 1
  if not live(id) then
    if not a.create then
      -- lapsed (the process stalled past its lease) and perhaps purged: start again from the whole record
      purge(id)
      result = 2
    else
      local lapsed = redis.call('ZRANGEBYSCORE', K_LEASE, '-inf', '(' .. NOW, 'LIMIT', 0, PURGE_PER_CALL)
      for _, old in ipairs(lapsed) do purge(old) end
      if redis.call('ZCARD', K_IDS) >= tonumber(a.limit) and not redis.call('ZSCORE', K_IDS, id) then
        return redis.error_reply('REGISTRY_FULL The connection registry holds its limit of ' .. a.limit
          .. ' connections (SIGNALBOX_CONNECTION_REGISTRY_LIMIT)')
      end
    end
    if result == 2 then return 2 end
  end
  if redis.call('ZADD', K_IDS, 0, id) == 1 then redis.call('INCR', R .. ':total') end
  redis.call('ZADD', K_LEASE, NOW + lease, id)
  local function hset(key, map)
    local args = {}
    for field, value in pairs(map or {}) do
      args[#args + 1] = field
      args[#args + 1] = value
    end
    if #args > 0 then redis.call('HSET', key, unpack(args)) end
  end
  local function hdel(key, fields)
    if fields and #fields > 0 then redis.call('HDEL', key, unpack(fields)) end
  end
  hset(c, a.set)
  hset(s, a.sub_set)
  hdel(s, a.sub_del)
  hset(p, a.prod_set)
  hset(d, a.dest_set)
  hdel(d, a.dest_del)
  expire_all(id, lease)
  return result
end

if op == 'renew' then
  local lease = tonumber(ARGV[3])
  local missing = {}
  for i = 4, #ARGV do
    local id = ARGV[i]
    if live(id) and redis.call('EXISTS', R .. ':c:' .. id) == 1 then
      redis.call('ZADD', K_LEASE, NOW + lease, id)
      expire_all(id, lease)
    else
      purge(id)
      missing[#missing + 1] = id
    end
  end
  return missing
end

if op == 'drop' then
  local n = 0
  for i = 3, #ARGV do
    if redis.call('ZSCORE', K_IDS, ARGV[i]) then n = n + 1 end
    purge(ARGV[i])
  end
  return n
end

-- Whether a live connection passes the filters: the destination first (one HEXISTS), then the few fields
-- the others need (HMGET), so a page of connections that do not match costs little.
local function matches(id, f)
  if f.destination and f.destination ~= '' then
    if redis.call('HEXISTS', R .. ':d:' .. id, f.destination) == 0 then return false end
  end
  if not (f.protocol or f.user or f.process or f.client) then return true end
  local v = redis.call('HMGET', R .. ':c:' .. id, 'protocol', 'user', 'process', 'client')
  if f.protocol and f.protocol ~= '' and v[1] ~= f.protocol then return false end
  if f.user and f.user ~= '' and v[2] ~= f.user then return false end
  if f.process and f.process ~= '' and v[3] ~= f.process then return false end
  if f.client and f.client ~= '' then
    local hay = string.lower((v[4] or '') .. ' ' .. id)
    if not string.find(hay, string.lower(f.client), 1, true) then return false end
  end
  return true
end

if op == 'list' then
  local cursor, count = ARGV[3], tonumber(ARGV[4])
  local f = cjson.decode(ARGV[5])
  local from = cursor == '' and '-' or '(' .. cursor
  local ids = redis.call('ZRANGEBYLEX', K_IDS, from, '+', 'LIMIT', 0, count)
  local out = {#ids == count and ids[#ids] or '', #ids}
  -- the lease scores of the whole page in one call (ZMSCORE, Redis 6.2)
  local expiry = #ids > 0 and redis.call('ZMSCORE', K_LEASE, unpack(ids)) or {}
  for i, id in ipairs(ids) do
    if not (expiry[i] and tonumber(expiry[i]) > NOW) then
      purge(id)
    elseif matches(id, f) then
      local c, s, p = keys_of(id)
      local flat = redis.call('HGETALL', c)
      if #flat > 0 then
        local row = {id, flat, redis.call('HLEN', s), redis.call('HLEN', p)}
        if f.with_destinations then row[5] = redis.call('HKEYS', R .. ':d:' .. id) end
        out[#out + 1] = row
      end
    end
  end
  return out
end

if op == 'get' then
  local id = ARGV[3]
  if not live(id) then return false end
  local c, s, p = keys_of(id)
  local flat = redis.call('HGETALL', c)
  if #flat == 0 then return false end
  return {flat, redis.call('HGETALL', s), redis.call('HGETALL', p)}
end

if op == 'close' then
  local id = ARGV[3]
  if not live(id) then return false end
  local c = keys_of(id)
  local fields = redis.call('HMGET', c, 'process', 'protocol')
  if not fields[2] then return false end
  redis.call('HSET', c, 'close_requested', string.format('%d', NOW), 'close_reason', ARGV[4])
  local process = fields[1] or ''
  if process ~= '' then
    local key = R .. ':close:' .. process
    redis.call('SADD', key, id)
    redis.call('PEXPIRE', key, 3600000)  -- a process that died never takes them: they go with the key
  end
  return {process, fields[2]}
end

if op == 'take' then
  local out = {}
  for _, id in ipairs(redis.call('SPOP', R .. ':close:' .. ARGV[3], tonumber(ARGV[4]))) do
    out[#out + 1] = {id, redis.call('HGET', R .. ':c:' .. id, 'close_reason') or ''}
  end
  return out
end

return redis.error_reply('invalid_request unknown connections op ' .. tostring(op))
