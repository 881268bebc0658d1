-- Virtual destinations (spec §10; broker_core/virtual.py builds the routing plan).
--
-- A send's origin argument may carry a plan: '<origin>+<msgpack plan>', plan =
-- { forward only (0/1), sendWhenNotMatched composites (count), { target uri, compiled selector or '',
-- original destination to set or '', further copies the target's own routing makes, sendWhenNotMatched
-- composite number or 0, flags (virtual topics' consumer queues: 1 selectorAware, 2 dropOnResourceLimit)
-- }, ... }. Each copy is recorded in K_FWD under '<id>|<target>' in the same
-- atomic step that accepts the message here, and operations.forward delivers it; a process that dies
-- in between leaves the record for the maintenance job, and the target drops an id it already has.
--@include message
--@include selector
--@include forward

-- a transacted send's probe is 'probe:<transaction>:<ttl ms>': it reserves the space it needs
-- (flow.lua flow.reserve) until the commit or rollback, or the transaction's end of life.
-- Origin 'drop' is a producer's send re-run by flow.py once it waited as long as a full
-- dropOnResourceLimit consumer queue lets it: a 'retry' whose copies for full such queues are dropped.
-- Everything here is a field of its module table `virtual`, its one top-level local: a script's main
-- chunk may have at most 200 locals, and every script that dispatches includes this file (a repeating
-- job's firing is routed, lifecycle.lua); the functions are built on first use (base.lua `lazy`), as most
-- of those scripts never route. virtual.selectors: the selectors decoded in this call.
local virtual = base.lazy({ selectors = {} }, function(virtual)
  function virtual.split_origin(arg)
    -- the usual origins, as the general case below reads them (no probe, no plan, not 'drop')
    if arg == 'producer' or arg == 'retry' or arg == 'forward' or arg == 'commit' then return arg, nil end
    local tx, ttl = string.match(arg, '^probe:([^:+]+):(%d+)$')
    if tx then
      flow.reservation = { tx = tx, ttl = tonumber(ttl) }
      return 'probe', nil
    end
    local plus = string.find(arg, '+', 1, true)
    local origin = plus and string.sub(arg, 1, plus - 1) or arg
    if origin == 'drop' then flow.drop, origin = true, 'retry' end
    if not plus then return origin, nil end
    return origin, cmsgpack.unpack(string.sub(arg, plus + 1))
  end


  function virtual.compiled_selector(text)
    if not virtual.selectors[text] then virtual.selectors[text] = cjson.decode(text) end
    return virtual.selectors[text]
  end

  -- selectorAware (SelectorAwareVirtualTopicInterceptor.shouldDispatch): the consumer queue under `prefix`
  -- gets a copy only when one of the consumers registered on it now takes it (no selector, or a selector
  -- that matches); a queue without consumers gets none. Read in the send's own atomic step, across hash
  -- tags like flow.lua's reads of a target (docs/broker_core.md, Virtual destinations).
  -- Once the call's selector work is spent (forward.work_spent) the queue gets the copy unchecked: many
  -- consumers' selectors cannot hold one send for longer than a call's worth; the copy waits in the
  -- queue like any message none of its consumers selects.
  function virtual.consumer_selects(prefix, id, m)
    local view
    for _, packed in ipairs(redis.call('HVALS', prefix .. ':consumers')) do
      local compiled = cmsgpack.unpack(packed).selector
      if type(compiled) ~= 'string' or compiled == '' then return true end
      if forward.work_spent() then return true end
      view = view or message.selector_view(id, m)
      if selector.matches(virtual.compiled_selector(compiled), view) then return true end
    end
    return false
  end

  -- dropOnResourceLimit: whether the copy of `id` (`bytes` packed) for the consumer queue `target` is
  -- dropped because the queue's flow control would fail it (VirtualTopicInterceptor swallows the
  -- ResourceAllocationException): full and failing at once, or full after the producer waited
  -- (flow.drop). Counted ('forward_dropped') and logged where the send was made.
  function virtual.copy_dropped(prefix, target, id, bytes)
    local full = flow.target_refusal(prefix, flow.message_charge(bytes))
    if not full or not (full[3] == 1 or flow.drop) then return false end
    base.meta_incr('forward_dropped')
    base.emit('forward_dropped', 'msg', id, 'target', target, 'used', full[1], 'limit', full[2])
    return true
  end

  -- Record the copies message `id` owes the plan's targets; returns whether it is also kept here.
  -- plan[1] = 0: kept whatever matched (no composite, or one with forwardOnly false). Otherwise plan[2] is
  -- the number of sendWhenNotMatched composites, numbered 1..n in their targets' 5th element: the message
  -- is kept when one of them matched none of its own targets (§10.2: other composites' targets, mirror and
  -- virtual-topic copies and a client-side composite's other parts are no match for it).
  function virtual.route(id, blob, m, plan)
    if not plan then return true end
    local matched = {}
    local recorded = {}
    for i = 3, #plan do
      local target, compiled, original, group = plan[i][1], plan[i][2], plan[i][3], plan[i][5] or 0
      local flags = tonumber(plan[i][6]) or 0
      local t_prefix = flow.destination_prefix(target)
      local wanted = true
      if compiled ~= '' then
        wanted = selector.matches(virtual.compiled_selector(compiled), message.selector_view(id, m))
      end
      if wanted and bit.band(flags, 1) ~= 0 then wanted = virtual.consumer_selects(t_prefix, id, m) end
      if wanted then
        if group > 0 then matched[group] = true end
        local dropped = not recorded[target] and bit.band(flags, 2) ~= 0
          and virtual.copy_dropped(t_prefix, target, id, #blob)
        if not recorded[target] and not dropped then
          recorded[target] = true
          -- until delivered, the copy counts against its target's memory limit ('memfwd' in the
          -- target's meta, read by flow.lua); operations.forward takes it off when it delivers the copy.
          -- A target that does not exist yet has no limit, and no keys are made for it here.
          local charge = 0
          if redis.call('EXISTS', t_prefix .. ':meta') == 1 then
            charge = flow.message_charge(#blob)
            redis.call('HINCRBY', t_prefix .. ':meta', 'memfwd', charge)
          end
          -- the 5th element orders delivery: operations.forward sends a batch in the order it was recorded
          redis.call('HSET', base.K_FWD, id .. '|' .. target,
                     cmsgpack.pack({ target, 'virtual', original, blob, base.meta_incr('fwdseq'), charge }))
          base.due_at(base.TP, base.NOW)
          forward.n = forward.n + 1
          base.meta_incr('forwarded')
          base.emit('forward', 'msg', id, 'target', target)
        end
      end
    end
    if plan[1] == 0 then return true end
    for g = 1, plan[2] do
      if not matched[g] then return true end  -- a sendWhenNotMatched composite matched nothing
    end
    return false
  end
end)
-- (rawget: in the EVAL form the table builds its functions on first use only, base.lua `lazy`)
--@on-call
if next(rawget(virtual, 'selectors')) ~= nil then virtual.selectors = {} end  -- (an empty one is as good as a new one)
--@on-call-end
