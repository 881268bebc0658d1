-- Memory usage and producer flow control (spec §9; broker_core/flow.py is the Python half).
--
-- A destination's usage is what its stored messages take ('mem' in K_META): every message (and every
-- repeating scheduled message's job) counts its packed bytes, at least the destination's
-- minimumMessageSize. The broker's usage is the sum over all destinations, kept by the same scripts in
-- the same atomic steps in K_USAGE (hash: used, limit, sendFailIfNoSpace, sendFailIfNoSpaceAfterTimeout).
-- K_USAGE is the one key outside the destination's hash tag (docs/broker_core.md, Flow control).
local K_USAGE = string.match(P, '^(.-):{') .. ':usage'
-- Messages are stored once per destination (a topic's under the topic, TP, not under a subscription), so
-- usage is counted in the destination's own meta hash whichever subscription a script has switched to.
local function flow_meta() return TP .. ':meta' end
local BROKER_DEFAULT_LIMIT = 1073741824  -- SystemUsage's memory limit when none is configured: 1 GB

local FLOW = { floor = nil }

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

-- Producer flow control (spec §9.1-9.2): nil when `need` more bytes fit, else why not:
-- {scope ('destination' or 'broker'), used, limit, fail at once (0/1), wait timeout ms (0 = no limit),
-- the full destination when it is not this one}. Unlike ActiveMQ, which accepts sends while usage is
-- below 100 % and so overshoots by a message, a send is refused when it would take usage past the limit:
-- the limit is never exceeded. With a routing plan (includes/virtual.lua) the copies count too: against
-- the broker's limit, and against each target's own memoryLimit (ActiveMQ sends a copy through the
-- target's flow control). The targets are read across hash tags, like K_USAGE; a target whose selector
-- would not match still counts (the check is before the selectors run).
local function memory_refusal(need, plan)
  local p = policy()
  local pol = { p['producerFlowControl'], p['memoryLimit'], p['sendFailIfNoSpace'],
                p['sendFailIfNoSpaceAfterTimeout'] }
  if flag_value(pol[1]) == 0 then return nil end  -- flow control off: the send is accepted
  local sys = redis.call('HMGET', K_USAGE, 'used', 'limit', 'sendFailIfNoSpace',
                         'sendFailIfNoSpaceAfterTimeout')
  local scope, used, limit, where
  local own = tonumber(pol[2]) or 0
  local copies = plan and (#plan - 2) or 0
  local kept = (plan and plan[1] == 1 and plan[2] == 0) and 0 or 1  -- forward only: nothing stays here
  local mine = tonumber(redis.call('HGET', flow_meta(), 'mem')) or 0
  local broker_used, broker_limit = tonumber(sys[1]) or 0, tonumber(sys[2]) or BROKER_DEFAULT_LIMIT
  if own > 0 and mine + need > own then
    scope, used, limit = 'destination', mine, own
  elseif broker_limit > 0 and broker_used + need * (kept + copies) > broker_limit then
    -- memoryLimit 0: the destination's limit is the broker's (a child usage with portion 1.0)
    scope, used, limit = 'broker', broker_used, broker_limit
  else
    local ns = string.match(TP, '^(.-):{')
    for i = 3, 2 + copies do
      local kind, name = string.match(plan[i][1], '^(%a+)://(.*)$')
      local prefix = ns .. ':{' .. (kind == 'topic' and 't' or 'q') .. ':' .. name .. '}'
      local t = redis.call('HMGET', prefix .. ':policy', 'producerFlowControl', 'memoryLimit')
      local t_limit = tonumber(t[2]) or 0
      if t_limit > 0 and flag_value(t[1]) ~= 0 then
        local t_used = tonumber(redis.call('HGET', prefix .. ':meta', 'mem')) or 0
        if t_used + need > t_limit then
          scope, used, limit, where = 'destination', t_used, t_limit, plan[i][1]
          break
        end
      end
    end
    if not scope then return nil end
  end
  local fail_now = flag_value(pol[3])
  if fail_now == nil then fail_now = flag_value(sys[3]) or 0 end
  local timeout = tonumber(pol[4]) or -1
  if timeout < 0 then timeout = tonumber(sys[4]) or 0 end
  return { scope, used, limit, fail_now, timeout, where or '' }
end
