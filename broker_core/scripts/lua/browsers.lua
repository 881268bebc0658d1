-- A queue's browsers (includes/base.lua live_browsers): counted among its consumers while their lease
-- lasts, never dispatched to. ARGV: now, op, then per op:
--   open lease_ms id prefetch selector -> {} (the queue must exist: NO_DESTINATION)
--   renew lease_ms ids...               -> {the ids that are not open (closed, or lapsed and removed)...}
--   close reason ids...                 -> {how many were open}
--   list most                           -> {id, prefetch, selector, ...}: at most `most` open ones, by lease
-- each followed by the tail (includes/dispatch.lua dispatch.add_tail), whose flag says when advisories
-- (a browser's opening and closing are advised as a consumer's) wait for the caller.
-- Each op first removes up to base.BROWSERS_PRUNED lapsed browsers (bounded; the maintenance visit does too).
-- The caller sends at most one connection's subscriptions a call (SIGNALBOX_WS_MAX_SUBSCRIPTIONS).
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local op, key, defs = ARGV[2], base.P .. ':browsers', base.P .. ':browsers:def'
local function reply(out) return dispatch.add_tail(out, 0, forward.with_flag(0), 0) end
base.prune_browsers()
if op == 'open' then
  local missing = base.require_destination()
  if missing then return missing end
  local lease_ms, id = tonumber(ARGV[3]), ARGV[4]
  redis.call('ZADD', key, string.format('%d', base.NOW + lease_ms), id)
  -- what a consumer advisory's replay tells of it (prefetch, then the selector: the first space splits them)
  redis.call('HSET', defs, id, ARGV[5] .. ' ' .. ARGV[6])
  base.due_at(base.P, base.NOW + lease_ms + 1)  -- the maintenance visit that removes it if it lapses
  -- ActiveMQ advises a browser as a consumer (its ConsumerInfo has browser=true)
  base.emit('consumer_add', 'consumer', id, 'browser', 1, 'priority', 0, 'exclusive', 0, 'prefetch', ARGV[5],
            'selector', ARGV[6])
  return reply({})
elseif op == 'renew' then
  local expiry, missing = string.format('%d', base.NOW + tonumber(ARGV[3])), {}
  for i = 4, #ARGV do
    if redis.call('ZADD', key, 'XX', 'CH', expiry, ARGV[i]) == 0 and not redis.call('ZSCORE', key, ARGV[i]) then
      missing[#missing + 1] = ARGV[i]
    end
  end
  return reply(missing)
elseif op == 'close' then
  local closed = 0
  for i = 4, #ARGV do
    if redis.call('ZREM', key, ARGV[i]) == 1 then
      redis.call('HDEL', defs, ARGV[i])
      closed = closed + 1
      base.emit('consumer_remove', 'consumer', ARGV[i], 'reason', ARGV[3], 'browser', 1)
    end
  end
  return reply({ closed })
elseif op == 'list' then
  local out = {}
  for _, id in ipairs(redis.call('ZRANGE', key, string.format('%d', base.NOW), '+inf', 'BYSCORE', 'LIMIT', 0,
                                 tonumber(ARGV[3]))) do
    local prefetch, selector = string.match(redis.call('HGET', defs, id) or '0 ', '^(%S*) (.*)$')
    out[#out + 1] = id
    out[#out + 1] = prefetch
    out[#out + 1] = selector
  end
  return reply(out)
end
return redis.error_reply('INVALID_OPERATION unknown browsers operation ' .. tostring(op))
