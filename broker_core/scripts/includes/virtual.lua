-- Virtual destinations (spec §10; broker_core/virtual.py builds the routing plan).
--
-- A send's origin argument may carry a plan: '<origin>+<msgpack plan>', plan =
-- { forward only (0/1), sendWhenNotMatched composites (count), { target uri, compiled selector or '',
-- original destination to set or '', further copies the target's own routing makes, sendWhenNotMatched
-- composite number or 0 }, ... }. Each copy is recorded in K_FWD under '<id>|<target>' in the same
-- atomic step that accepts the message here, and operations.forward delivers it; a process that dies
-- in between leaves the record for the maintenance job, and the target drops an id it already has.
--@include message
--@include selector
--@include forward

-- a transacted send's probe is 'probe:<transaction>:<ttl ms>': it reserves the space it needs
-- (flow.lua flow_reserve) until the commit or rollback, or the transaction's end of life.
local function split_origin(arg)
  local tx, ttl = string.match(arg, '^probe:([^:+]+):(%d+)$')
  if tx then
    FLOW.reserve = { tx = tx, ttl = tonumber(ttl) }
    return 'probe', nil
  end
  local plus = string.find(arg, '+', 1, true)
  if not plus then return arg, nil end
  return string.sub(arg, 1, plus - 1), cmsgpack.unpack(string.sub(arg, plus + 1))
end

local VIRTUAL_SELECTORS = {}
on_call(function() VIRTUAL_SELECTORS = {} end)

-- Record the copies message `id` owes the plan's targets; returns whether it is also kept here.
-- plan[1] = 0: kept whatever matched (no composite, or one with forwardOnly false). Otherwise plan[2] is
-- the number of sendWhenNotMatched composites, numbered 1..n in their targets' 5th element: the message
-- is kept when one of them matched none of its own targets (§10.2: other composites' targets, mirror and
-- virtual-topic copies and a client-side composite's other parts are no match for it).
local function route_virtual(id, blob, m, plan)
  if not plan then return true end
  local matched = {}
  local recorded = {}
  local ns = string.match(TP, '^(.-):{')
  for i = 3, #plan do
    local target, selector, original, group = plan[i][1], plan[i][2], plan[i][3], plan[i][5] or 0
    local wanted = true
    if selector ~= '' then
      if not VIRTUAL_SELECTORS[selector] then VIRTUAL_SELECTORS[selector] = cjson.decode(selector) end
      wanted = selector_matches(VIRTUAL_SELECTORS[selector], selector_view(id, m))
    end
    if wanted then
      if group > 0 then matched[group] = true end
      if not recorded[target] then
        recorded[target] = true
        -- until delivered, the copy counts against its target's memory limit ('memfwd' in the
        -- target's meta, read by flow.lua); operations.forward takes it off when it delivers the copy.
        -- A target that does not exist yet has no limit, and no keys are made for it here.
        local kind, name = string.match(target, '^(%a+)://(.*)$')
        local t_prefix = ns .. ':{' .. (kind == 'topic' and 't' or 'q') .. ':' .. name .. '}'
        local charge = 0
        if redis.call('EXISTS', t_prefix .. ':meta') == 1 then
          charge = message_charge(#blob)
          redis.call('HINCRBY', t_prefix .. ':meta', 'memfwd', charge)
        end
        -- the 5th element orders delivery: operations.forward sends a batch in the order it was recorded
        redis.call('HSET', K_FWD, id .. '|' .. target,
                   cmsgpack.pack({ target, 'virtual', original, blob, meta_incr('fwdseq'), charge }))
        FWD.n = FWD.n + 1
        meta_incr('forwarded')
        emit('forward', 'msg', id, 'target', target)
      end
    end
  end
  if plan[1] == 0 then return true end
  for g = 1, plan[2] do
    if not matched[g] then return true end  -- a sendWhenNotMatched composite matched nothing
  end
  return false
end
