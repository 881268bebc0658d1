-- The expiry sweep (spec §6): examine up to maxExpirePageSize pending (not in-flight) messages from the
-- sweep cursor on and expire those whose time has run out; successive calls walk the whole queue.
-- Skipped while the queue is paused, as in ActiveMQ. ARGV: now.
-- Returns {examined, expired, done (1 when the walk reached the end), the tail (includes/dispatch.lua
-- dispatch.add_tail: no dispatch, its flags and next time)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
if redis.call('EXISTS', base.K_META) == 0 then return dispatch.add_tail({ 0, 0, 1, nil, nil, nil }, 0, 0, 0) end  -- deleted meanwhile: nothing to do
if redis.call('HGET', base.K_META, 'paused') == '1' then return dispatch.add_tail({ 0, 0, 1, nil, nil, nil }, 0, 0, 0) end
if base.SUB then
  -- A topic's sweep (Topic.doBrowse, 5.17.2) expires for durable subscriptions that are not active only
  -- (BrokerService's enableMessageExpirationOnActiveDurableSubs, default false, is not offered): an
  -- active one's and a non-durable one's expired messages go when their dispatch meets them.
  local sub = redis.call('HMGET', base.K_META, 'durable', 'active')
  if sub[1] ~= '1' or (sub[2] or '') ~= '' then return dispatch.add_tail({ 0, 0, 1, nil, nil, nil }, 0, 0, 0) end
end
local cursor = redis.call('HGET', base.K_META, 'sweep_cursor') or ''
local lower = '-inf'
if cursor ~= '' then lower = '(' .. cursor end
local page = base.policy_num('maxExpirePageSize')
local batch = redis.call('ZRANGEBYSCORE', base.K_PENDING, lower, '+inf', 'WITHSCORES', 'LIMIT', 0, page)
local expired = 0
for i = 1, #batch, 2 do
  local id = batch[i]
  local blob = redis.call('HGET', base.K_MSGS, id)
  if blob then
    local m = message.unpack(blob)
    if message.is_expired(m) then
      lifecycle.expire_pending(id, m, blob)
      expired = expired + 1
    end
  end
end
local done = #batch / 2 < page
if done then cursor = '' else cursor = batch[#batch] end
redis.call('HSET', base.K_META, 'sweep_cursor', cursor)
if expired > 0 then base.emit('sweep', 'examined', #batch / 2, 'expired', expired) end
return dispatch.add_tail({ #batch / 2, expired, done and 1 or 0, nil, nil, nil }, 0, forward.with_flag(0), lifecycle.next_unpark())
