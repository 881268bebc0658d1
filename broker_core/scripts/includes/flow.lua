-- Memory usage and producer flow control (spec §9; broker_core/flow.py is the Python half).
--
-- A destination's usage is what its stored messages take ('mem' in K_META): every message (and every
-- repeating scheduled message's job) counts its packed bytes, at least the destination's
-- minimumMessageSize. The broker's usage is the sum over all destinations, kept by the same scripts in
-- the same atomic steps in K_USAGE (hash: used, limit, sendFailIfNoSpace, sendFailIfNoSpaceAfterTimeout).
-- K_USAGE is the one key outside the destination's hash tag (docs/broker_core.md, Flow control).
local K_USAGE
-- Messages are stored once per destination (a topic's under the topic, TP, not under a subscription), so
-- usage is counted in the destination's own meta hash whichever subscription a script has switched to.
local function flow_meta() return TP .. ':meta' end
local BROKER_DEFAULT_LIMIT = 1073741824  -- SystemUsage's memory limit when none is configured: 1 GB

local FLOW = { floor = nil }
on_call(function()
  K_USAGE = string.match(P, '^(.-):{') .. ':usage'
  FLOW.floor, FLOW.reserve = nil, nil
end)

-- What a message of `bytes` packed bytes counts. The floor is read from the policy once, when the
-- destination first stores something, and kept in K_META, so a charge and its release always agree
-- even if minimumMessageSize changes later.
local function message_charge(bytes)
  if not FLOW.floor then
    FLOW.floor = tonumber(redis.call('HGET', flow_meta(), 'memmin'))
    if not FLOW.floor then
      FLOW.floor = tonumber(redis.call('HGET', K_POLICY, 'minimumMessageSize')) or 1024
      redis.call('HSET', flow_meta(), 'memmin', FLOW.floor)
    end
  end
  if bytes > FLOW.floor then return bytes end
  return FLOW.floor
end

local function memory_add(bytes)
  redis.call('HINCRBY', flow_meta(), 'mem', bytes)
  redis.call('HINCRBY', K_USAGE, 'used', bytes)
end

-- A message of `bytes` packed bytes is now stored / no longer stored here.
local function memory_charge(bytes) memory_add(message_charge(bytes)) end
local function memory_release(bytes)
  if bytes and bytes > 0 then memory_add(-message_charge(bytes)) end
end

local function flag_value(v)
  if v == '1' or v == 'true' then return 1 end
  if v == '0' or v == 'false' then return 0 end
  return nil  -- unset (-1): inherit
end

-- space held for transactions between their sends and their commit (spec §9: limits are never
-- passed): '<TP>:memres' (transaction -> 'bytes|expires ms') and K_USAGE .. ':res' ('<tx>|<TP>' -> the
-- same). Entries past their transaction's life are dropped when read; commit and rollback delete them
-- (scripts/flow_release.lua).
local function reserved(key)
  local flat = redis.call('HGETALL', key)
  local total = 0
  for i = 1, #flat, 2 do
    local bytes, expires = string.match(flat[i + 1], '^(%d+)|(%d+)$')
    if not bytes or tonumber(expires) <= NOW then
      redis.call('HDEL', key, flat[i])
    else
      total = total + tonumber(bytes)
    end
  end
  return total
end

local function add_reservation(key, field, need, expires)
  local old = redis.call('HGET', key, field)
  local bytes = old and tonumber(string.match(old, '^(%d+)|')) or 0
  redis.call('HSET', key, field, (bytes + need) .. '|' .. expires)
end

-- A transacted send's probe fitted: hold `need` bytes for its transaction (virtual.lua split_origin).
local function flow_reserve(need)
  local r = FLOW.reserve
  if not r then return end
  local expires = NOW + r.ttl
  add_reservation(TP .. ':memres', r.tx, need, expires)
  add_reservation(K_USAGE .. ':res', r.tx .. '|' .. TP, need, expires)
end

-- Bytes a destination holds or has coming: stored, copies recorded for it but not yet delivered
-- ('memfwd', includes/virtual.lua) and transactions' reservations.
local function held(prefix, stored)
  local mem = redis.call('HMGET', prefix .. ':meta', 'mem', 'memfwd')
  local coming = tonumber(mem[2]) or 0
  if coming < 0 then coming = 0 end  -- the target was deleted and recreated while a copy was on its way
  return (tonumber(stored or mem[1]) or 0) + coming + reserved(prefix .. ':memres')
end

-- Producer flow control (spec §9.1-9.2): nil when `need` more bytes fit, else why not:
-- {scope ('destination' or 'broker'), used, limit, fail at once (0/1), wait timeout ms (0 = no limit),
-- the full destination when it is not this one, the bytes the refused check needed}. Unlike ActiveMQ,
-- which accepts sends while usage is below 100 % and so overshoots by a message, a send is refused when
-- it would take usage past the limit: the limit is never exceeded. With a routing plan
-- (includes/virtual.lua) the copies count too: against the broker's limit (with the copies each target's
-- own routing makes, the plan's 4th element), and against each target's own memoryLimit under the
-- target's own flow control (ActiveMQ sends a copy through the target's Queue.send), even when this
-- destination's producerFlowControl is off. The targets are read across hash tags, like K_USAGE; a
-- target whose selector would not match still counts (the check is before the selectors run).
local function memory_refusal(need, plan)
  local p = policy()
  local pol = { p['producerFlowControl'], p['memoryLimit'], p['sendFailIfNoSpace'],
                p['sendFailIfNoSpaceAfterTimeout'] }
  local sys = redis.call('HMGET', K_USAGE, 'used', 'limit', 'sendFailIfNoSpace',
                         'sendFailIfNoSpaceAfterTimeout')
  local scope, used, limit, where, total
  local fail_v, timeout_v = pol[3], pol[4]
  local copies, weight = 0, 0
  if plan then
    for i = 3, #plan do
      copies = copies + 1
      weight = weight + 1 + (tonumber(plan[i][4]) or 0)
    end
  end
  local kept = (plan and plan[1] == 1 and plan[2] == 0) and 0 or 1  -- forward only: nothing stays here
  if flag_value(pol[1]) ~= 0 then
    local own = tonumber(pol[2]) or 0
    local broker_used = (tonumber(sys[1]) or 0) + reserved(K_USAGE .. ':res')
    local broker_limit = tonumber(sys[2]) or BROKER_DEFAULT_LIMIT
    local mine = own > 0 and held(TP) or 0
    if own > 0 and mine + need > own then
      scope, used, limit, total = 'destination', mine, own, need
    elseif broker_limit > 0 and broker_used + need * (kept + weight) > broker_limit then
      -- memoryLimit 0: the destination's limit is the broker's (a child usage with portion 1.0)
      scope, used, limit, total = 'broker', broker_used, broker_limit, need * (kept + weight)
    end
  end
  if not scope then
    local ns = string.match(TP, '^(.-):{')
    for i = 3, 2 + copies do
      local kind, name = string.match(plan[i][1], '^(%a+)://(.*)$')
      local prefix = ns .. ':{' .. (kind == 'topic' and 't' or 'q') .. ':' .. name .. '}'
      local t = redis.call('HMGET', prefix .. ':policy', 'producerFlowControl', 'memoryLimit',
                           'sendFailIfNoSpace', 'sendFailIfNoSpaceAfterTimeout')
      local t_limit = tonumber(t[2]) or 0
      if t_limit > 0 and flag_value(t[1]) ~= 0 then
        local t_used = held(prefix)
        if t_used + need > t_limit then
          scope, used, limit, where, total = 'destination', t_used, t_limit, plan[i][1], need
          fail_v, timeout_v = t[3], t[4]  -- the target's own flow control decides
          break
        end
      end
    end
    if not scope then return nil end
  end
  local fail_now = flag_value(fail_v)
  if fail_now == nil then fail_now = flag_value(sys[3]) or 0 end
  local timeout = tonumber(timeout_v) or -1
  if timeout < 0 then timeout = tonumber(sys[4]) or 0 end
  return { scope, used, limit, fail_now, timeout, where or '', total }
end
