-- Memory usage and producer flow control (spec §9; broker_core/flow.py is the Python half).
--
-- A destination's usage is what its stored messages take ('mem' in K_META): every message (and every
-- repeating scheduled message's job) counts its packed bytes, at least the destination's
-- minimumMessageSize. The broker's usage is the sum over all destinations, kept by the same scripts in
-- the same atomic steps in flow.usage (hash: used, limit, sendFailIfNoSpace, sendFailIfNoSpaceAfterTimeout).
-- flow.usage is the one key outside the destination's hash tag (docs/broker_core.md, Flow control).
-- Messages are stored once per destination (a topic's under the topic, TP, not under a subscription), so
-- usage is counted in the destination's own meta hash whichever subscription a script has switched to.
-- Its module table `flow`. Per call: floor, the destination's minimumMessageSize as first charged;
-- reservation, a transacted send's probe ({tx, ttl}, set by virtual.lua split_origin); drop, a 'drop'
-- retry (virtual.lua). Kept per prefix: usage_of/usage (flow.usage's name, <ns>:usage)/usage_res.
local flow = { floor = nil, usage_of = nil, usage = nil, usage_res = nil,
               reservation = nil, drop = nil, BROKER_DEFAULT_LIMIT = false }
function flow.meta_key()  -- TP .. ':meta' (made once per prefix, base.lua use_prefix)
  return base.K_TMETA
end
flow.BROKER_DEFAULT_LIMIT = 1073741824  -- SystemUsage's memory limit when none is configured: 1 GB

--@on-call
if flow.usage_of ~= base.P then
  flow.usage_of, flow.usage = base.P, string.match(base.P, '^(.-):{') .. ':usage'
  flow.usage_res = flow.usage .. ':res'  -- flow.usage .. ':res'
end
flow.floor, flow.reservation, flow.drop = nil, nil, nil
--@on-call-end

-- What a message of `bytes` packed bytes counts. The floor is read from the policy once, when the
-- destination first stores something, and kept in K_META, so a charge and its release always agree
-- even if minimumMessageSize changes later.
function flow.message_charge(bytes)
  if not flow.floor then
    flow.floor = tonumber(redis.call('HGET', flow.meta_key(), 'memmin'))
    if not flow.floor then
      flow.floor = tonumber(redis.call('HGET', base.K_POLICY, 'minimumMessageSize')) or 1024
      redis.call('HSET', flow.meta_key(), 'memmin', flow.floor)
    end
  end
  if bytes > flow.floor then return bytes end
  return flow.floor
end

-- The floor as a caller read it from flow.meta_key() with other fields (its 'memmin', false when unset):
-- message_charge then need not read it again.
function flow.floor_read(memmin)
  if not flow.floor and memmin then flow.floor = base.number(memmin) end
end

function flow.memory_add(bytes)
  bytes = base.NOW_TEXT.num(bytes)  -- base.lua: formatted once for both
  redis.call('HINCRBY', flow.meta_key(), 'mem', bytes)
  redis.call('HINCRBY', flow.usage, 'used', bytes)
end
-- The broker's usage alone, for a caller that writes the destination's 'mem' itself (send.lua, with its
-- counters).
function flow.usage_add(bytes)
  redis.call('HINCRBY', flow.usage, 'used', base.NOW_TEXT.num(bytes))
end

-- A message of `bytes` packed bytes is now stored / no longer stored here.
function flow.memory_charge(bytes) flow.memory_add(flow.message_charge(bytes)) end
function flow.memory_release(bytes)
  if bytes and bytes > 0 then flow.memory_add(-flow.message_charge(bytes)) end
end

function flow.flag_value(v)
  if v == '1' or v == 'true' then return 1 end
  if v == '0' or v == 'false' then return 0 end
  return nil  -- unset (-1): inherit
end

-- space held for transactions between their sends and their commit (spec §9: limits are never
-- passed): '<TP>:memres' (transaction -> 'bytes|expires ms') and flow.usage .. ':res' ('<tx>|<TP>' -> the
-- same). Commit and rollback delete them (scripts/lua/flow_release.lua); an entry whose transaction is
-- gone (its key '<ns>:tx:<tx>' expired: the owner that renewed it died, ops/transactions.py) or past its
-- `expires` is dropped when read.
--
-- Reading them all is what a flow check costs per open transaction holding space, so each key's entries are
-- also summed as they are written (flow.reserved_sum: the destination's meta 'memres', the broker's
-- flow.usage 'res'): every entry counted, live or not, so the sum is never below what the live ones hold.
-- A check first uses the sums (flow.memory_refusal): a send that fits with them fits, whatever lapsed, and
-- reads no entry; only one that would not fit reads them all (flow.reserved), which drops the dead ones and
-- writes the sum again, as it is now exact. A sum not there (entries written before sums were kept) is
-- worked out by that read, and until then nothing adds to it.
function flow.reserved_sum(key)
  if key == flow.usage_res then return flow.usage, 'res' end
  return string.sub(key, 1, -8) .. ':meta', 'memres'  -- ('<TP>:memres' -> '<TP>:meta')
end

-- Entry `field` = `value`: its bytes while its transaction lives, else nil, and the entry is dropped.
-- Second: the bytes it counted (in the sum).
function flow.entry_live(key, field, value)
  local bytes, expires = string.match(value, '^(%d+)|(%d+)$')
  local tx = string.match(base.P, '^(.-):{') .. ':tx:' .. string.match(field, '^[^|]+')
  if bytes and tonumber(expires) > base.NOW and redis.call('EXISTS', tx) == 1 then return tonumber(bytes) end
  redis.call('HDEL', key, field)
  return nil, tonumber(bytes) or 0
end

-- The live entries' bytes under `key`, the dead ones dropped; its sum written (exact now: kept from here
-- on, also when there is none, so the next check reads the sum alone; not on a destination that does not
-- exist, whose meta it would make).
function flow.reserved(key)
  local flat = redis.call('HGETALL', key)
  local total = 0
  for i = 1, #flat, 2 do total = total + (flow.entry_live(key, flat[i], flat[i + 1]) or 0) end
  local sum_key, field = flow.reserved_sum(key)
  if #flat > 0 or sum_key == flow.usage or redis.call('EXISTS', sum_key) == 1 then
    redis.call('HSET', sum_key, field, base.NOW_TEXT.num(total))
  end
  return total
end

-- At least what the live entries under `key` hold: its sum `sum` (as the caller read it with what else it
-- reads there: flow.reserved_sum), else (not kept yet) flow.reserved's figure. RESERVED_LOOKS entries are
-- looked at, any of them, and those whose transaction is gone dropped, so a dead one leaves (and its bytes
-- the sum) without a check that needs them all; a sum of 0 has none holding anything (each one is counted).
flow.RESERVED_LOOKS = 8
function flow.reserved_most(key, sum)
  if not sum then return flow.reserved(key) end
  sum = tonumber(sum)
  if sum <= 0 then return 0 end
  local sum_key, field = flow.reserved_sum(key)
  local flat = redis.call('HRANDFIELD', key, flow.RESERVED_LOOKS, 'WITHVALUES')
  local dropped = 0
  for i = 1, #flat, 2 do
    local live, counted = flow.entry_live(key, flat[i], flat[i + 1])
    if not live then dropped = dropped + counted end
  end
  if dropped > 0 then
    sum = sum - dropped
    redis.call('HSET', sum_key, field, base.NOW_TEXT.num(sum))
  end
  return sum
end

-- `bytes` more (or fewer) under `key`'s sum, when it is kept: a sum made now, with entries already there,
-- would count too little.
function flow.reserved_add(key, bytes)
  if bytes == 0 then return end
  local sum_key, field = flow.reserved_sum(key)
  if redis.call('HEXISTS', sum_key, field) == 1 then
    redis.call('HINCRBY', sum_key, field, base.NOW_TEXT.num(bytes))
  elseif bytes > 0 and redis.call('EXISTS', key) == 0 then
    redis.call('HSET', sum_key, field, base.NOW_TEXT.num(bytes))
  end
end

-- Entry `field` under `key` ends (a commit or rollback, a deletion): its bytes leave the sum.
function flow.reservation_end(key, field)
  local entry = redis.call('HGET', key, field)
  if not entry then return end
  flow.reserved_add(key, 0 - (tonumber(string.match(entry, '^(%d+)|')) or 0))  -- (0 - x: Lua's -(0) is -0)
  redis.call('HDEL', key, field)
end

function flow.add_reservation(key, field, need, expires)
  local old = redis.call('HGET', key, field)
  local bytes = old and tonumber(string.match(old, '^(%d+)|')) or 0
  flow.reserved_add(key, need)  -- (before the entry: a key with none yet starts its sum)
  redis.call('HSET', key, field, (bytes + need) .. '|' .. expires)
end

-- A transacted send's probe fitted: hold `need` bytes for its transaction (virtual.lua split_origin).
function flow.reserve(need)
  local r = flow.reservation
  if not r then return end
  local expires = base.NOW + r.ttl
  flow.add_reservation(base.TP .. ':memres', r.tx, need, expires)
  flow.add_reservation(flow.usage .. ':res', r.tx .. '|' .. base.TP, need, expires)
end

-- Bytes a destination holds or has coming: stored, copies recorded for it but not yet delivered
-- ('memfwd', includes/virtual.lua) and transactions' reservations (`most`: their sum, at least what they
-- hold; else read one by one).
function flow.held(prefix, stored, most)
  local mem = redis.call('HMGET', prefix .. ':meta', 'mem', 'memfwd', 'memres')
  local coming = tonumber(mem[2]) or 0
  if coming < 0 then coming = 0 end  -- the target was deleted and recreated while a copy was on its way
  local reserved = most and flow.reserved_most(prefix .. ':memres', mem[3]) or flow.reserved(prefix .. ':memres')
  return (tonumber(stored or mem[1]) or 0) + coming + reserved
end

-- The key prefix of the destination `uri` names ('queue://x' / 'topic://x'), in this namespace.
function flow.destination_prefix(uri)
  local kind, name = string.match(uri, '^(%a+)://(.*)$')
  return string.match(base.TP, '^(.-):{') .. ':{' .. (kind == 'topic' and 't' or 'q') .. ':' .. name .. '}'
end

-- Whether a full destination fails a send at once and how long it lets one wait: its policy's
-- sendFailIfNoSpace / sendFailIfNoSpaceAfterTimeout where set, else the broker's (`sys`, from flow.usage).
-- (`sys` holds the broker's two rules only once one was needed: flow.system_usage reads its usage alone, as
-- a send that fits needs nothing more; nothing a script does changes the rules.)
function flow.wait_rule(fail_v, timeout_v, sys)
  local fail_now = flow.flag_value(fail_v)
  local timeout = tonumber(timeout_v) or -1
  if (fail_now == nil or timeout < 0) and sys[3] == nil then
    local rules = redis.call('HMGET', flow.usage, 'sendFailIfNoSpace', 'sendFailIfNoSpaceAfterTimeout')
    sys[3], sys[4] = rules[1], rules[2]
  end
  if fail_now == nil then fail_now = flow.flag_value(sys[3]) or 0 end
  if timeout < 0 then timeout = tonumber(sys[4]) or 0 end
  return fail_now, timeout
end

-- The broker's usage: {used, limit} (the rules are read by flow.wait_rule when needed).
-- The broker's {used, limit}, and `res`: the sum of its reservations (flow.reserved_sum).
function flow.system_usage()
  local sys = redis.call('HMGET', flow.usage, 'used', 'limit', 'res')
  sys.res, sys[3] = sys[3], nil  -- ([3] and [4]: flow.wait_rule's)
  return sys
end

-- A virtual destination's target under `prefix` goes through its own flow control (ActiveMQ sends a copy
-- through the target's Queue.send): nil when `need` more bytes fit there (or it has no limit of its own,
-- or flow control off), else {used, limit, fail at once (0/1), wait timeout ms}.
function flow.target_refusal(prefix, need, sys)
  local t = redis.call('HMGET', prefix .. ':policy', 'producerFlowControl', 'memoryLimit',
                       'sendFailIfNoSpace', 'sendFailIfNoSpaceAfterTimeout')
  local t_limit = tonumber(t[2]) or 0
  if t_limit <= 0 or flow.flag_value(t[1]) == 0 then return nil end
  if flow.held(prefix, nil, true) + need <= t_limit then return nil end  -- (fits with the sum: reservation_most)
  local t_used = flow.held(prefix)
  if t_used + need <= t_limit then return nil end
  local fail_now, timeout = flow.wait_rule(t[3], t[4], sys or flow.system_usage())
  return { t_used, t_limit, fail_now, timeout }
end

-- Producer flow control (spec §9.1-9.2): nil when `need` more bytes fit, else why not:
-- {scope ('destination' or 'broker'), used, limit, fail at once (0/1), wait timeout ms (0 = no limit),
-- the full destination when it is not this one, the bytes the refused check needed, 1 when that full
-- destination is a virtual topic's consumer queue with dropOnResourceLimit}. Unlike ActiveMQ,
-- which accepts sends while usage is below 100 % and so overshoots by a message, a send is refused when
-- it would take usage past the limit: the limit is never exceeded. With a routing plan
-- (includes/virtual.lua) the copies count too: against the broker's limit (with the copies each target's
-- own routing makes, the plan's 4th element), and against each target's own memoryLimit under the
-- target's own flow control (ActiveMQ sends a copy through the target's Queue.send), even when this
-- destination's producerFlowControl is off. The targets are read across hash tags, like flow.usage; a
-- target whose selector would not match still counts (the check is before the selectors run).
-- dropOnResourceLimit (the plan's flags, config/virtual.py COPY_DROP_ON_RESOURCE_LIMIT): a full consumer queue
-- that fails sends at once, or any full one once the producer has waited its time (flow.drop, a send
-- re-run with origin 'drop' by flow.py), refuses nothing: virtual.route drops its copy instead.
function flow.memory_refusal(need, plan)
  local p = base.policy()
  local sys = flow.system_usage()
  local scope, used, limit, total
  local fail_v, timeout_v = p['sendFailIfNoSpace'], p['sendFailIfNoSpaceAfterTimeout']
  local copies, weight = 0, 0
  if plan then
    for i = 3, #plan do
      copies = copies + 1
      weight = weight + 1 + (tonumber(plan[i][4]) or 0)
    end
  end
  local kept = (plan and plan[1] == 1 and plan[2] == 0) and 0 or 1  -- forward only: nothing stays here
  if flow.flag_value(p['producerFlowControl']) ~= 0 then
    local own = tonumber(p['memoryLimit']) or 0
    local broker_limit = tonumber(sys[2]) or flow.BROKER_DEFAULT_LIMIT
    -- first with the reservations' sums (at least what they hold: flow.reserved_sum); what does not fit
    -- with them is checked again with the live reservations read one by one
    for _, most in ipairs({ true, false }) do
      local reserved = most and flow.reserved_most(flow.usage_res, sys.res) or flow.reserved(flow.usage_res)
      local broker_used = (tonumber(sys[1]) or 0) + reserved  -- (flow.usage_res: flow.usage .. ':res')
      local mine = own > 0 and flow.held(base.TP, nil, most) or 0
      scope = nil
      if own > 0 and mine + need > own then
        scope, used, limit, total = 'destination', mine, own, need
      elseif broker_limit > 0 and broker_used + need * (kept + weight) > broker_limit then
        -- memoryLimit 0: the destination's limit is the broker's (a child usage with portion 1.0)
        scope, used, limit, total = 'broker', broker_used, broker_limit, need * (kept + weight)
      end
      if not scope then break end
    end
  end
  if not scope then
    for i = 3, 2 + copies do
      local full = flow.target_refusal(flow.destination_prefix(plan[i][1]), need, sys)
      if full then
        local drops = bit.band(tonumber(plan[i][6]) or 0, 2) ~= 0  -- dropOnResourceLimit
        if not (drops and (full[3] == 1 or flow.drop)) then
          -- the target's own flow control decides whether the producer waits
          return { 'destination', full[1], full[2], full[3], full[4], plan[i][1], need, drops and 1 or 0 }
        end
      end
    end
    if not scope then return nil end
  end
  local fail_now, timeout = flow.wait_rule(fail_v, timeout_v, sys)
  return { scope, used, limit, fail_now, timeout, '', total, 0 }
end
