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
-- {scope ('destination' or 'broker'), used, limit, fail at once (0/1), wait timeout ms (0 = no limit)}.
-- Unlike ActiveMQ, which accepts sends while usage is below 100 % and so overshoots by a message, a send
-- is refused when it would take usage past the limit: the limit is never exceeded.
local function memory_refusal(need)
  local p = policy()
  local pol = { p['producerFlowControl'], p['memoryLimit'], p['sendFailIfNoSpace'],
                p['sendFailIfNoSpaceAfterTimeout'] }
  if flag_value(pol[1]) == 0 then return nil end  -- flow control off: the send is accepted
  local sys = redis.call('HMGET', K_USAGE, 'used', 'limit', 'sendFailIfNoSpace',
                         'sendFailIfNoSpaceAfterTimeout')
  local scope, used, limit
  local own = tonumber(pol[2]) or 0
  local mine = tonumber(redis.call('HGET', flow_meta(), 'mem')) or 0
  local broker_used, broker_limit = tonumber(sys[1]) or 0, tonumber(sys[2]) or BROKER_DEFAULT_LIMIT
  if own > 0 and mine + need > own then
    scope, used, limit = 'destination', mine, own
  elseif broker_limit > 0 and broker_used + need > broker_limit then
    -- memoryLimit 0: the destination's limit is the broker's (a child usage with portion 1.0)
    scope, used, limit = 'broker', broker_used, broker_limit
  else
    return nil
  end
  local fail_now = flag_value(pol[3])
  if fail_now == nil then fail_now = flag_value(sys[3]) or 0 end
  local timeout = tonumber(pol[4]) or -1
  if timeout < 0 then timeout = tonumber(sys[4]) or 0 end
  return { scope, used, limit, fail_now, timeout }
end
