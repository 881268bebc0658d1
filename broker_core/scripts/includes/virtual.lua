-- Virtual destinations (spec §10; broker_core/virtual.py builds the routing plan).
--
-- A send's origin argument may carry a plan: '<origin>+<msgpack plan>', plan =
-- { forward only (0/1), send when not matched (0/1), { target uri, compiled selector or '', original
-- destination to set or '' }, ... }. Each copy is recorded in K_FWD under '<id>|<target>' in the same
-- atomic step that accepts the message here, and operations.forward delivers it; a process that dies
-- in between leaves the record for the maintenance job, and the target drops an id it already has.
--@include message
--@include selector
--@include forward

local function split_origin(arg)
  local plus = string.find(arg, '+', 1, true)
  if not plus then return arg, nil end
  return string.sub(arg, 1, plus - 1), cmsgpack.unpack(string.sub(arg, plus + 1))
end

local VIRTUAL_SELECTORS = {}

-- Record the copies message `id` owes the plan's targets; returns whether it is also kept here
-- (forwardOnly false, or sendWhenNotMatched and no target matched).
local function route_virtual(id, blob, m, plan)
  if not plan then return true end
  local matched = 0
  for i = 3, #plan do
    local target, selector, original = plan[i][1], plan[i][2], plan[i][3]
    local wanted = true
    if selector ~= '' then
      if not VIRTUAL_SELECTORS[selector] then VIRTUAL_SELECTORS[selector] = cjson.decode(selector) end
      wanted = selector_matches(VIRTUAL_SELECTORS[selector], selector_view(id, m))
    end
    if wanted then
      -- the 5th element orders delivery: operations.forward sends a batch in the order it was recorded
      redis.call('HSET', K_FWD, id .. '|' .. target,
                 cmsgpack.pack({ target, 'virtual', original, blob, meta_incr('fwdseq') }))
      FWD.n = FWD.n + 1
      matched = matched + 1
      meta_incr('forwarded')
      emit('forward', 'msg', id, 'target', target)
    end
  end
  if plan[2] == 1 then return matched == 0 end  -- sendWhenNotMatched overrides forwardOnly
  return plan[1] == 0
end
