-- Bookkeeping of the maintenance jobs (broker_core/maintenance.py): one lease per job and destination,
-- and the probe that tells the recovery job whether a destination has anything for it.
--
-- A lease is the key <prefix>:lease:<job> holding "<token>|<expires ms>". It is judged by the caller's
-- clock, like everything else here; the key's own PX expiry (same length, Redis's clock) only makes sure
-- a lease nobody looks at again goes away.
-- KEYS[1] = the destination's prefix. ARGV: now, op, then per op:
--   acquire job token ttl  -> 1 if the caller holds the lease now (taken, or renewed: same token), else 0
--   release job token      -> 1 if the caller held it (and it is gone now), else 0
--   recover token ttl grace -> {held, lapsed consumers, forwards waiting, next dispatch time (0 = none),
--                             closed consumers whose messages are still owed and ended subscriptions
--                             whose messages are still to release (a closer died between chunks:
--                             includes/lifecycle.lua return_owed) and a topic's unfinished
--                             fan-outs (a sender died: includes/fanout.lua)};
--                             takes the 'recover' lease only when there is something to do. Forwards
--                             count only once they have waited `grace` ms: until then the process that
--                             queued them is taken to be delivering them.
--@include base
NOW = tonumber(ARGV[1])
local op = ARGV[2]

local function lease_key(job) return P .. ':lease:' .. job end

local function acquire(job, token, ttl)
  local key = lease_key(job)
  local held = redis.call('GET', key)
  if held then
    local owner, expires = string.match(held, '^(.*)|(%d+)$')
    if owner ~= token and (tonumber(expires) or 0) > NOW then return 0 end
  end
  redis.call('SET', key, token .. '|' .. string.format('%d', NOW + ttl), 'PX', ttl)
  return 1
end

if op == 'acquire' then
  return acquire(ARGV[3], ARGV[4], tonumber(ARGV[5]))
elseif op == 'release' then
  local key = lease_key(ARGV[3])
  local held = redis.call('GET', key)
  if held and string.match(held, '^(.*)|') == ARGV[4] then
    redis.call('DEL', key)
    return 1
  end
  return 0
elseif op == 'recover' then
  local lapsed = redis.call('ZCOUNT', K_LEASES, '-inf', '(' .. NOW)
  local forwards = redis.call('HLEN', K_FWD)
  local stale = false
  if forwards == 0 then
    redis.call('HDEL', P .. ':maint', 'recover:fwd_since')
  else
    local since = tonumber(redis.call('HGET', P .. ':maint', 'recover:fwd_since') or '')
    if not since then
      redis.call('HSET', P .. ':maint', 'recover:fwd_since', string.format('%d', NOW))
    else
      stale = NOW - since >= tonumber(ARGV[5])
    end
  end
  -- Dispatch must run again when a parked message (redelivery delay, scheduled delivery) comes due or a
  -- delayed start ends; every other script runs dispatch itself.
  local due = 0
  local first = redis.call('ZRANGE', K_PARKED, 0, 0, 'WITHSCORES')
  if #first > 0 then due = tonumber(first[2]) end
  local hold = tonum(redis.call('HGET', K_META, 'hold_until'), 0)
  if hold > 0 and (due == 0 or hold < due) then due = hold end
  local owed = redis.call('HLEN', P .. ':closing') + redis.call('SCARD', TP .. ':ended')
  if not SUB then owed = owed + redis.call('LLEN', TP .. ':fanout') end  -- includes/fanout.lua
  local held = 0
  if lapsed > 0 or stale or owed > 0 or (due > 0 and due <= NOW) then
    held = acquire('recover', ARGV[3], tonumber(ARGV[4]))
  end
  if not stale then forwards = 0 end
  return {held, lapsed, forwards, due, owed}
end
return redis.error_reply('INVALID_OPERATION unknown maintenance operation ' .. tostring(op))
