-- The dispatch pass (spec §1.4), run in bounded chunks.
--
-- ActiveMQ pages at most maxPageSize messages into memory and stops paging while that many wait for a
-- consumer, so messages behind 200 unmatched ones starve. Here a pass walks the whole pending zset in
-- order, one chunk of maxPageSize messages per call, and the next call continues where the last one
-- stopped (meta 'cursor'). Per-consumer FIFO is kept the way ActiveMQ keeps it inside one pass: a
-- consumer found full is left out for the rest of the pass (set 'passfull'). A pass restarts at the head
-- when something may have made an earlier message dispatchable (meta 'dirty': room freed, consumer
-- added or removed, groups reset, a message returned ahead of the cursor); otherwise it rests at the
-- tail so a new message costs one examination. A pass restarted only because a consumer it left out for
-- being full has room again starts where it first left one out (meta 'resume'), not at the head.

--@include message
--@include consumers
--@include groups
--@include selector
--@include forward
--@include lifecycle
--@include outbox
--@include operator

-- Hand message `id` to consumer c: in flight, in its outbox, logged, owner woken; with `first`, marked the
-- first of its group for c (groups.lua groups.allows). Counters are kept in `c` and `tally` and written once
-- at the end of the chunk (see flush_counts). With `writes` (a page of more than one message) the
-- deliveries' writes are collected and made with one command per key when the page is done (dispatch.flush_page:
-- nothing in the pass reads those keys in between); a page of one message writes at once (collecting costs
-- more tables than it saves commands).
-- Its module table is `dispatch`.
local dispatch = {}
-- A pull consumer (prefetch 0) whose own receive call runs this pass: what is dispatched to it is handed
-- over by that same call, so waking its adapter would only make it ask again for nothing. Its wake-up is
-- skipped (`woken_later`), and receive.lua publishes it after all if anything is left in its outbox.
--@on-call
dispatch.receiver, dispatch.woken_later = nil, nil
--@on-call-end
function dispatch.wake(c)
  if c.id == dispatch.receiver then dispatch.woken_later = true else redis.call('PUBLISH', c.def.notify, c.id) end
end
function dispatch.new_page() return { ids = {}, inflight = {}, by_consumer = {}, consumers = {}, firsts = {} } end
function dispatch.deliver(c, id, score, tally, fresh, writes, first, blob)
  -- (a consumer armed for pushes, outbox.lua push_*, gets the message itself instead of an outbox entry)
  local pushed = outbox.push_armed(c)
  local b = base
  local num = b.NOW_TEXT.num
  -- A message this call stored (message.fresh) has never been delivered: no counter to read. The counter is
  -- passed on as stored (only HINCRBY writes it: the digits Redis would make of the number).
  local redeliveries = not fresh and redis.call('HGET', b.K_REDELIV, id) or '0'
  message.pass_dirty.pending = nil
  local digits = num(score)  -- base.lua: the digits of a whole number below 2^53
  if type(digits) ~= 'string' then digits = string.format('%.0f', score) end
  tally.dseq = tally.dseq + 1
  if writes then
    writes.ids[#writes.ids + 1] = id
    writes.inflight[#writes.inflight + 1] = id
    writes.inflight[#writes.inflight + 1] = c.id .. '|' .. digits  -- all digits
    local mine = writes.by_consumer[c]
    if not mine then
      mine = { c = c, window = {}, outbox = {} }
      writes.by_consumer[c] = mine
      writes.consumers[#writes.consumers + 1] = mine
    end
    mine.window[#mine.window + 1] = num(tally.dseq)
    mine.window[#mine.window + 1] = id
    if pushed then outbox.push_add(c, id, tally.dseq, blob, redeliveries, first)
    else mine.outbox[#mine.outbox + 1] = id end
    if first then writes.firsts[#writes.firsts + 1] = id end
  else
    if first then redis.call('SADD', b.K_GFIRST, id) end
    redis.call('ZREM', b.K_PENDING, id)
    redis.call('HSET', b.K_INFLIGHT, id, c.id .. '|' .. digits)
    redis.call('ZADD', b.K_CINF(c.id), num(tally.dseq), id)
    if pushed then
      outbox.push_add(c, id, tally.dseq, blob, redeliveries, first)
    elseif redis.call('RPUSH', b.K_COUT(c.id), id) == 1 and c.def.notify then
      dispatch.wake(c)
    end
  end
  c.n = c.n + 1
  c.delivered = (c.delivered or 0) + 1
  if c.prefetch == 0 then c.ext = c.ext - 1 end
  tally.dispatched = tally.dispatched + 1
  -- the enqueue time (message.lua times_added); never below 0, should another caller's clock be behind
  local arrived = message.arrived(blob)
  if arrived then tally.times[#tally.times + 1] = arrived < b.NOW and b.NOW - arrived or 0 end
  b.emit_message(nil, 'dispatch', 'msg', id, 'consumer', c.id, 'redeliveries', redeliveries)  -- (b.emit's work)
end

-- The writes dispatch.deliver collected; a consumer whose outbox was empty is woken, one armed gets its pushes.
function dispatch.flush_page(writes)
  if not writes or #writes.ids == 0 then
    outbox.push_flush()
    return
  end
  base.call_many('ZREM', base.K_PENDING, writes.ids)
  base.call_many('HSET', base.K_INFLIGHT, writes.inflight)
  if #writes.firsts > 0 then base.call_many('SADD', base.K_GFIRST, writes.firsts) end
  for i = 1, #writes.consumers do
    local mine = writes.consumers[i]
    local c = mine.c
    base.call_many('ZADD', base.K_CINF(c.id), mine.window)
    if #mine.outbox > 0 then
      local queued = base.call_many('RPUSH', base.K_COUT(c.id), mine.outbox)
      if queued == #mine.outbox and c.def.notify then dispatch.wake(c) end
    end
  end
  outbox.push_flush()
end

-- Consumer c's counters, and the slow_since change of the pass (consumers.lua note_slow), its group count
-- if it moved (groups.lua) and its pushes' 'push' and 'rcv' (outbox.lua push_flush), written once at the end
-- of the pass.
function dispatch.flush_consumer(c)
  local slow, pushed = c.slow_write, c.push_write
  c.slow_write, c.push_write = nil, nil
  if c.groups_moved then consumers.groups_written() end  -- (consumers.lua join_order)
  local num = base.NOW_TEXT.num
  if c.delivered then
    local dispatched = c.dispatched + c.delivered
    if slow == true or c.groups_moved then
      local fields = { 'n', num(c.n), 'ext', num(c.ext), 'dispatched', num(dispatched) }
      if slow == true then fields[7], fields[8] = 'slow_since', base.NOW_TEXT.get() end
      if c.groups_moved then
        fields[#fields + 1] = 'groups'
        fields[#fields + 1] = num(c.groups)
      end
      if pushed then
        fields[#fields + 1], fields[#fields + 2] = 'push', num(c.push)
        fields[#fields + 1], fields[#fields + 2] = 'rcv', num(c.rcv)
      end
      redis.call('HSET', base.K_C(c.id), unpack(fields))
    elseif pushed then  -- (the common cases, without a table)
      redis.call('HSET', base.K_C(c.id), 'n', num(c.n), 'ext', num(c.ext), 'dispatched', num(dispatched),
                 'push', num(c.push), 'rcv', num(c.rcv))
    else
      redis.call('HSET', base.K_C(c.id), 'n', num(c.n), 'ext', num(c.ext), 'dispatched', num(dispatched))
    end
    c.dispatched = dispatched
    c.delivered = nil
  else
    if slow == true then redis.call('HSET', base.K_C(c.id), 'slow_since', base.NOW_TEXT.get()) end
    if c.groups_moved then redis.call('HSET', base.K_C(c.id), 'groups', num(c.groups)) end
    if pushed then redis.call('HSET', base.K_C(c.id), 'push', num(c.push), 'rcv', num(c.rcv)) end
  end
  c.groups_moved = false
  if slow == false then redis.call('HDEL', base.K_C(c.id), 'slow_since') end
end

-- Returns the destination's counters (field, value, ...) for the caller's one write of K_META; writes each
-- consumer's own (flush_consumer).
function dispatch.flush_counts(cons, tally)
  local meta
  consumers.slow_rule.defer = false
  for i = 1, #cons do
    local c = cons[i]
    -- (a consumer the pass never counted has nothing to write: all of that comes with counting it)
    if c.loaded then dispatch.flush_consumer(c) end
  end
  if tally.dispatched > 0 then
    meta = { 'dseq', base.NOW_TEXT.num(tally.dseq), 'dispatched', base.NOW_TEXT.num(tally.total + tally.dispatched) }
    tally.total = tally.total + tally.dispatched
    tally.dispatched = 0
  else
    meta = {}
  end
  local times = tally.times
  if #times > 0 then
    if base.SUB then  -- (a topic's is the topic's: its own meta hash, read and written here)
      local key = base.TP .. ':meta'
      redis.call('HSET', key, 'enqtime', message.times_added(redis.call('HGET', key, 'enqtime'), times))
    else  -- (read with the pass state: dispatch.STATE)
      meta[#meta + 1], meta[#meta + 2] = 'enqtime', message.times_added(tally.times_stored, times)
    end
    tally.times = {}
  end
  return meta
end

-- Is there a consumer with room at all, and one that this pass may still use (not in `excluded`)? And how
-- many messages the usable ones can take, which bounds the page read next: summed until it reaches `want`
-- (all of them without), so a consumer with a large window spares reading the others' counters. (A function
-- of its own, not a closure made by every pass.)
function dispatch.pass_room(cons, excluded, want)
  local usable, any, free = false, false, 0
  for i = 1, #cons do  -- (numeric loops here: ipairs is a call into C per element)
    local c = cons[i]
    local slots = c.alive and consumers.free_slots(c) or 0
    if slots > 0 then
      any = true
      if not excluded[c.id] then
        usable, free = true, free + slots
        if want and free >= want then break end
      end
    end
  end
  return usable, any, free
end

-- The work on consumers one chunk of the pass may do before it ends with `more` after its current message
-- (at least one message a chunk), the next chunk going on from there: each consumer the sort that rotates
-- the one served walks counts one (consumers.sort returns how many: all of them under a group map or mixed
-- priorities), each consumer a message is offered to OFFER_STEPS (its checks, selector and group owner cost
-- about five times a sort's step). With a group map each delivery re-sorts every consumer, and a message of
-- a group whose owner is full is offered to every consumer: at 1,000 consumers 100 such messages in one
-- chunk took 33-46 ms of CPU, and 134-253 ms (docs/benchmarks.md, "Session 32"). (Since session 33 only the
-- first of them in a chunk is: the others of a group with the same owner are passed over for a step each,
-- the walk recorded in dispatch.pass.)
dispatch.CONSUMER_STEPS = 10000
dispatch.OFFER_STEPS = 5

-- A pass ends (dispatch.pass): the next one starts at the head, unless this one left a consumer out for
-- being full (`resume`, the cursor then, and `resume_skipped`, its skipped count then, nil: stored in meta)
-- and nothing since needs a walk from the head (`full`, or message.pass_dirty.value true). Returns the pass
-- state the next one starts with: cursor, skipped count, the ended pass's skipped count (`pass_skipped`),
-- dirty, full, excluded, resume, resume_skipped, and true (the excluded set changed).
function dispatch.pass_end(resume, full, resume_skipped, pass_skipped)
  local start, skipped = '', 0
  if resume ~= '-' and not (full or message.pass_dirty.value == true) then
    start = resume
    skipped = resume_skipped or tonumber(redis.call('HGET', base.K_META, 'resume_skipped')) or 0
  end
  message.pass_dirty.value = false
  return start, skipped, pass_skipped, false, false, {}, '-', nil, true
end

-- One chunk of the pass. Returns dispatched count, 1 when the pass has more to examine, and the time
-- a delayed start (consumersBeforeDispatchStarts / timeBeforeDispatchStarts) holds dispatch until.
-- The pass state in meta (dispatch.pass): paused, hold_until, fence, then the rest, read after them.
dispatch.STATE = { 'paused', 'hold_until', 'fence', 'cursor', 'dirty', 'owner', 'pass_skipped', 'dseq',
                   'dispatched', 'dirty_room', 'resume', 'offered', 'enqtime' }
function dispatch.pass(budget, known)
  -- the pass state is read in two steps where messages may be pending or not: an ack on a drained queue
  -- (the check for pending messages below) needs only the first two fields; after a send (message.fresh)
  -- there are, and all of it is read at once
  -- (third: the fence of a close whose returns are still owed, lifecycle.lua closing_key: the pass reads
  -- only messages below it)
  local sent = next(message.fresh) ~= nil
  local state = sent and redis.call('HMGET', base.K_META, unpack(dispatch.STATE))
                or redis.call('HMGET', base.K_META, 'paused', 'hold_until', 'fence')
  if state[1] == '1' then return 0, 0, 0 end
  local upper = state[3] and '(' .. state[3] or '+inf'
  local hold = base.tonum(state[2], 0)
  if hold > 0 then
    local needed = base.policy_num('consumersBeforeDispatchStarts')
    if base.NOW >= hold or (needed > 0 and redis.call('HLEN', base.K_CONSUMERS) >= needed) then
      redis.call('HDEL', base.K_META, 'hold_until')
    else
      return 0, 0, hold
    end
  end
  -- Nothing pending (e.g. an ack on a drained queue): the pass has nothing to examine, so its state
  -- stays as it is; the consumers need not be read. (After a send there is: no need to ask.)
  if not sent and redis.call('ZCARD', base.K_PENDING) == 0 then return 0, 0, 0 end
  local cons = consumers.load(true, known)
  if #cons == 0 then return 0, 0, 0 end
  if not budget or budget <= 0 then budget = base.policy_num('maxPageSize') end
  -- (the fields after the first three: in `state` from its 4th on, else read now, from the 1st on)
  local rest, o = state, 3
  if not sent then rest, o = redis.call('HMGET', base.K_META, unpack(dispatch.STATE, 4)), 0 end

  local cursor = rest[o + 1] or ''
  -- dirty: the pass must walk again what it has walked; `full`: from the head, else only from `resume`
  -- (message.lua mark_dirty, mark_room)
  local full = rest[o + 2] == '1'
  local dirty = full or rest[o + 7] == '1'
  local owner = rest[o + 3] or nil
  if owner == '' then owner = nil end
  local number = base.number
  local pass_skipped = number(rest[o + 4]) or 0
  local tally = { dseq = number(rest[o + 5]) or 0, dispatched = 0, total = number(rest[o + 6]) or 0,
                  times = {}, times_stored = rest[o + 10] }
  local excluded = {}
  local passfull_before = message.pass_dirty.passfull_key == base.K_PASSFULL and message.pass_dirty.passfull
                          or redis.call('SMEMBERS', base.K_PASSFULL)  -- (read by room_freed: message.lua)
  for i = 1, #passfull_before do excluded[passfull_before[i]] = true end
  local strict = base.policy_flag('strictOrderDispatch')
  local order_changed = false
  local examined, dispatched, more = 0, 0, 0
  -- Selector evaluations end the chunk once they have done a call's worth of matching (after at least
  -- one message): the rest of the page waits for the next chunk (selector.lua selector.bytes). So do the
  -- messages it reads, once the call holds its byte budget (outbox.lua outbox.CALL_MOST_BYTES: reading
  -- a message into Lua costs by the byte, and so does pushing it).
  local selector_work, work_cut = selector.bytes, false
  local steps, STEPS, OFFER = 0, dispatch.CONSUMER_STEPS, dispatch.OFFER_STEPS  -- (dispatch.CONSUMER_STEPS)
  -- One message offered to many consumers with selectors can spend a call's worth too: the chunk then
  -- ends before the next evaluation, with the message still at the cursor, and meta 'offered' records
  -- which consumers' selectors refused it ("<ids, comma-separated>|<message id>"), so the next chunk
  -- offers it to the others only (a selector's answer for a message does not change; reset_pass, which a
  -- consumer's close runs, forgets the record).
  local offered_stored = rest[o + 9] or ''
  local offered_id, refused_before = nil, {}
  do
    local ids, mid = string.match(offered_stored, '^([^|]*)|(.*)$')
    if mid then
      offered_id = mid
      for cid in string.gmatch(ids, '[^,]+') do refused_before[cid] = true end
    end
  end
  local offered_out = offered_stored  -- what the chunk leaves in meta 'offered'

  local excluded_changed = false
  local last_skipped = nil  -- the skipped count of the pass that ended last, written with the state below
  -- Where the pass first left out a full consumer (the cursor then) and its skipped count there; '-' while
  -- it has left none out. Every message up to there was examined while each consumer had room (or was
  -- gone, and comes back as a new one: mark_dirty), so room freed cannot make one of them dispatchable: a
  -- pass that ends for want of room, or for room freed, is followed by one that starts there, not at the
  -- head. A consumer whose window stays full behind a long backlog nobody takes would otherwise have each
  -- freed slot walk the whole backlog again.
  -- (written only when they change, as 'dirty_room'; the skipped count is read when needed)
  local resume_stored, room_stored = rest[o + 8] or '-', rest[o + 7] == '1'
  local resume, resume_skipped = resume_stored, nil
  -- (where the pass leaves a consumer out for being full: `if resume == '-' then resume, resume_skipped =
  -- cursor, pass_skipped end`, written out in place; where it ends, dispatch.pass_end. No closures over this
  -- function's locals: each local a closure names becomes an object made and collected every pass,
  -- bench/redis_instructions.py)

  -- A pass that had reached the tail and is dirty (room freed for a consumer it left out, a consumer
  -- added, ...) starts over before it looks at what this call sent: ActiveMQ runs each send's dispatch as
  -- a new doActualDispatch, whose fullConsumers set starts empty, over the pending list from its head.
  -- Otherwise the new messages would be offered with the old pass's full set, passing over a consumer
  -- that has room again (B, full for m3, acks; m4 went to C although B was next in turn).
  if sent and dirty and cursor ~= '' then
    local after = redis.call('ZRANGEBYSCORE', base.K_PENDING, '(' .. cursor, upper, 'LIMIT', '0', '1')
    if after[1] and message.fresh[after[1]] then
      cursor, pass_skipped, last_skipped, dirty, full, excluded, resume, resume_skipped, excluded_changed =
        dispatch.pass_end(resume, full, resume_skipped, pass_skipped)
    end
  end

  consumers.slow_rule.defer = true  -- until flush_counts (consumers.lua note_slow)
  message.pass_dirty.in_pass = true  -- until the state is written, below (message.lua mark_dirty)
  local writes = nil  -- the deliveries' writes of the page being examined (dispatch.deliver)
  -- what the loop below calls for each message, as locals: a module's field read per call costs
  -- instructions (bench/redis_instructions.py; message.fresh is this call's table throughout the pass)
  -- (free_slots: consumers.is_full is free_slots(c) <= 0, asked without a call of its own)
  local fresh_of, head, free_slots, note_slow, allows, deliver =
    message.fresh, message.head, consumers.free_slots, consumers.note_slow, groups.allows, dispatch.deliver
  local now, K_PENDING, K_MSGS = base.NOW, base.K_PENDING, base.K_MSGS
  -- A message of a group whose owner is full (or is not offered it: its lease run out, noLocal, another
  -- consumer exclusive) is offered to every consumer and taken by none. ActiveMQ's walk for the next message of a group with the
  -- same owner gives the same answer and changes nothing, as long as nothing changed in between: the full
  -- consumers it meets are left out already (`excluded`), the others' slow marks are cleared already, each
  -- other consumer's assignMessageGroup refuses it (the owner is another, live consumer; the sequence is not
  -- 1). So within a chunk such a message is passed over without the walk (`blocked` below), its group's
  -- cached-map entry touched as the walk's first assignMessageGroup would (groups.stored), counted skipped as
  -- the walk's end would. The record is of the last such walk:
  -- `memo_owner`, its group's owner; `memo_excluded`, the pass's left-out set then (pass_end makes a new
  -- one); `memo_dispatched`, the chunk's deliveries then (a delivery moves a window, the order, maybe a
  -- group); `memo_conn` its message's connection when a noLocal consumer was offered it (whom noLocal
  -- turns away depends on it). A walk that evaluated a selector is not recorded: the next message's
  -- evaluations may fail where its did not (meta 'selector_errors' counts each), so it is walked again.
  -- Without it, at 1,000 consumers one chunk's work budget (CONSUMER_STEPS) passed over two such messages.
  local memo_owner, memo_excluded, memo_dispatched, memo_nolocal, memo_conn = false, nil, -1, false, nil
  while true do
    dispatch.flush_page(writes)  -- (before anything below reads the pending zset)
    writes = nil
    local usable, any, free = dispatch.pass_room(cons, excluded, budget - examined)
    if not any then                             -- everyone is full: the next pass starts over
      if message.pass_dirty.pending == base.K_PENDING or redis.call('ZCARD', base.K_PENDING) > 0 then  -- (message.lua)
        for i = 1, #cons do if cons[i].alive then note_slow(cons[i], true) end end
      end
      if resume == '-' then resume, resume_skipped = cursor, pass_skipped end  -- (left out)
      cursor, pass_skipped, last_skipped, dirty, full, excluded, resume, resume_skipped, excluded_changed =
        dispatch.pass_end(resume, full, resume_skipped, pass_skipped)
      break
    end
    if not usable then                          -- room only where this pass may not go: start over
      cursor, pass_skipped, last_skipped, dirty, full, excluded, resume, resume_skipped, excluded_changed =
        dispatch.pass_end(resume, full, resume_skipped, pass_skipped)
      usable, any, free = dispatch.pass_room(cons, excluded, budget - examined)
    end
    if examined >= budget then more = 1 break end
    local lower = '-inf'
    if cursor ~= '' then lower = '(' .. cursor end
    -- A page the consumers can take (and a few more, for those a selector or a group owner skips); a
    -- full window freeing one slot reads a handful of messages, not maxPageSize of them.
    local page = budget - examined  -- math.min(budget - examined, free + 8)
    if free + 8 < page then page = free + 8 end
    local batch = redis.call('ZRANGEBYSCORE', K_PENDING, lower, upper, 'WITHSCORES', 'LIMIT', '0',
                             base.NOW_TEXT.num(page))
    if #batch > 2 then writes = dispatch.new_page() end
    dirty = dirty or message.pass_dirty.value
    if #batch == 0 then
      -- At the tail: restart from the head if something changed behind the cursor, else rest here.
      if not dirty then break end
      cursor, pass_skipped, last_skipped, dirty, full, excluded, resume, resume_skipped, excluded_changed =
        dispatch.pass_end(resume, full, resume_skipped, pass_skipped)
      -- Nothing left at all: the pass is over (a later message starts the next one at the head).
      if redis.call('ZCARD', base.K_PENDING) == 0 then break end
    end
    local restart = false
    local at_tail = #batch > 0 and #batch / 2 < page
    for i = 1, #batch, 2 do
      -- (with a walk recorded, the step budget is checked once the message is read: one the record
      -- passes over costs a step or two, so those after a walk that spent the budget go in this chunk)
      if examined > 0 and (selector.bytes - selector_work >= selector.call_limit
                           or outbox.call_bytes >= outbox.CALL_MOST_BYTES
                           or steps >= STEPS and not (memo_excluded == excluded and memo_dispatched == dispatched)) then
        more, work_cut = 1, true
        break
      end
      local id, score = batch[i], number(batch[i + 1])
      examined = examined + 1
      local fresh = fresh_of[id]
      fresh_of[id] = nil
      local blob = fresh and fresh[1] or redis.call('HGET', K_MSGS, id)
      if blob then outbox.call_bytes = outbox.call_bytes + #blob end
      if not blob then
        redis.call('ZREM', K_PENDING, id)
        message.pass_dirty.pending = nil
        cursor = batch[i + 1]
      else
        -- the loop reads four fields (message.head, message.lua: without decoding the message
        -- when it can); `full` is the whole message, decoded when a selector or the expiry needs it
        local full = fresh and fresh[2]
        local exp, gid, seq, conn
        if not full then exp, gid, seq, conn = head(blob, true) end
        if exp == nil then
          full = full or message.unpack(blob)
          exp, gid, seq, conn = tonumber(full[message.EXPIRATION]) or 0, full[message.GROUP],
                                tonumber(full[message.GROUP_SEQ]) or 0, full[message.CONNECTION]
        end  -- (head's sequence is a number already)
        if exp > 0 and now > exp then  -- is_expired
          if base.SUB and string.sub(base.SUB, 1, 2) == 'c.' then
            -- a non-durable topic subscription: ActiveMQ 5.17.2's TopicSubscription.dispatchMatched
            -- discards it (discard(), not messageExpired: not counted expired, the discard's cause)
            lifecycle.discard_pending(id, blob, 'expired')
          else
            lifecycle.expire_pending(id, full or message.unpack(blob), blob)
          end
          cursor = batch[i + 1]
        else
          local view = nil
          local target, first = nil, false
          local available = false
          local skip = (id == offered_id) and refused_before or nil
          local refused = nil
          local grouped = gid ~= nil and gid ~= false
          local blocked = false  -- its group's owner is the one of the walk recorded (above the loop)
          if grouped and memo_excluded == excluded and memo_dispatched == dispatched and seq ~= 1 and not skip
             and (not memo_nolocal or memo_conn == conn) then
            -- (read, not offered: the message's offer, which touches its entry in the cached map, is made
            -- below, by its walk or, passed over, here)
            local v, slot = groups.peek(gid)
            blocked = v and groups.owner_of(v) == memo_owner
            if blocked then groups.stored(id, gid, seq, slot, v) end
          end
          local reached, walk_selector, walk_nolocal = false, false, false  -- (what the walk below met)
          if blocked then
            steps = steps + OFFER
            available = true
          elseif examined > 1 and steps >= STEPS then  -- (the budget's check deferred above)
            examined = examined - 1
            fresh_of[id] = fresh
            more, work_cut = 1, true
            break
          end
          if gid then consumers.gmap.create() end
          for k = 1, blocked and 0 or #cons do
            local c = cons[k]
            steps = steps + OFFER
            if c.alive and not excluded[c.id] then
              if free_slots(c) <= 0 then  -- consumers.is_full
                if resume == '-' then resume, resume_skipped = cursor, pass_skipped end  -- (left out)
                excluded[c.id] = true
                excluded_changed = true
                note_slow(c, true)
              else
                note_slow(c, false)
                available = true
                local ok = owner == nil or owner == c.id
                if ok and c.def.nolocal and c.def.conn then
                  walk_nolocal = true
                  if c.def.conn == conn then ok = false end
                end
                if ok and skip and skip[c.id] then
                  -- it refused this message in an earlier chunk (only a consumer with a selector is
                  -- recorded): its selector is not decoded again, which in the offer's last chunks was a
                  -- decode of nearly every consumer's selector per call
                  ok = false
                elseif ok then
                  local expr = consumers.selector_of(c)
                  if expr then
                    walk_selector = true
                    local spent = selector.bytes - selector_work
                    if spent > 0 and spent >= selector.call_limit then
                      more, work_cut = 1, true
                      break
                    end
                    if not full then full = message.unpack(blob) end
                    view = view or message.selector_view(id, full)
                    local failed
                    ok, failed = selector.matches(expr, view)
                    if failed then base.meta_incr('selector_errors') end
                    if not ok then
                      refused = refused or {}
                      refused[#refused + 1] = c.id
                    end
                  end
                end
                if ok and grouped then  -- (a message in no group: groups.allows is true)
                  reached = true
                  ok, first = allows(c, id, gid, seq, cons)
                end
                if ok then target = c break end
              end
            end
          end
          if work_cut then
            -- cut while offering it: it stays at the cursor, its refusals recorded for the next chunk
            local ids = {}
            if skip then for cid in pairs(skip) do ids[#ids + 1] = cid end end
            for r = 1, #(refused or {}) do ids[#ids + 1] = refused[r] end
            offered_out = table.concat(ids, ',') .. '|' .. id
            fresh_of[id] = fresh
            break
          end
          if skip then offered_out = '' end  -- (done with the message the record was for)
          if reached and not target and not walk_selector and not skip and available then
            -- walked past every consumer, its group's assignMessageGroup refusing each one it was offered
            -- to (so the group has a live owner: groups.allows; its value is the walk's, not read again)
            memo_owner = groups.owner_of(groups.stored(id, gid, seq))
            memo_excluded, memo_dispatched, memo_nolocal, memo_conn = excluded, dispatched, walk_nolocal, conn
          end
          if target then
            deliver(target, id, score, tally, fresh, writes, first, blob)
            dispatched = dispatched + 1
            cursor = batch[i + 1]
            if not strict and #cons > 1 and target.id ~= owner then
              -- Round-robin: the target goes to the back of its band, so peers get one message each in turn.
              for j, c in ipairs(cons) do
                if c == target then table.remove(cons, j) break end
              end
              cons[#cons + 1] = target
              steps = steps + consumers.sort(cons)
              order_changed = true
            end
          elseif not available then
            -- No consumer this pass may use has room: this message is examined again by the next pass.
            restart = true
            break
          else
            cursor = batch[i + 1]
            pass_skipped = pass_skipped + 1
            base.meta_incr('skipped')
          end
        end
      end
    end
    if work_cut then break end
    if restart then
      local _, any_left = dispatch.pass_room(cons, excluded)
      cursor, pass_skipped, last_skipped, dirty, full, excluded, resume, resume_skipped, excluded_changed =
        dispatch.pass_end(resume, full, resume_skipped, pass_skipped)
      if not any_left then break end
    elseif at_tail and not (dirty or message.pass_dirty.value) then
      break  -- the pass rests at the tail; no need to ask Redis again
    end
  end

  dispatch.flush_page(writes)
  local counts = dispatch.flush_counts(cons, tally)
  groups.lru_flush(counts)
  if excluded_changed then
    local passfull = {}
    for cid in pairs(excluded) do passfull[#passfull + 1] = cid end
    -- nothing in the pass adds to the set: it holds what was read at the start
    if #passfull_before > 0 then redis.call('DEL', base.K_PASSFULL) end
    base.call_many('SADD', base.K_PASSFULL, passfull)
    message.pass_dirty.passfull_key = nil
  end
  full = full or message.pass_dirty.value == true
  dirty = dirty or message.pass_dirty.value
  message.pass_dirty.in_pass = false
  if last_skipped then
    counts[#counts + 1] = 'last_pass_skipped'
    counts[#counts + 1] = base.NOW_TEXT.num(last_skipped)
  end
  if (dirty and true or false) ~= room_stored then
    counts[#counts + 1] = 'dirty_room'
    counts[#counts + 1] = dirty and '1' or '0'
  end
  if offered_out ~= offered_stored then
    counts[#counts + 1] = 'offered'
    counts[#counts + 1] = offered_out
  end
  if resume ~= resume_stored then
    counts[#counts + 1] = 'resume'
    counts[#counts + 1] = resume
    if resume_skipped then
      counts[#counts + 1] = 'resume_skipped'
      counts[#counts + 1] = base.NOW_TEXT.num(resume_skipped)
    end
  end
  redis.call('HSET', base.K_META, 'cursor', cursor, 'dirty', full and '1' or '0', 'pass_skipped',
             base.NOW_TEXT.num(pass_skipped), unpack(counts))
  if order_changed then consumers.save_order(cons) end
  return dispatched, more, 0
end

dispatch.UNPARK_PER_CALL = 100

-- What every script runs last: bring back parked messages that are due, run one chunk of the pass.
-- Returns the dispatched count; flags (1: the pass has more to examine, 2: forwards wait in K_FWD);
-- and when to run dispatch again (a delayed start, or the next parked message), 0 if never.
-- `known`: consumers the caller has read and kept current (consumers.lua load_consumers), or nil.
function dispatch.chunk(budget, known)
  lifecycle.unpark_due(dispatch.UNPARK_PER_CALL)
  if base.SUB then lifecycle.fire_topic_jobs(dispatch.UNPARK_PER_CALL) end  -- (its topic's jobs)
  local dispatched, more, hold = dispatch.pass(budget, known)
  if hold == 0 then hold = lifecycle.next_unpark() end
  return dispatched, forward.with_flag(more), hold
end

-- The tail every script that can leave work behind ends its reply with (broker_core/scripts/calls.py reads it
-- the same way for all of them): its last three values are dispatched, flags (1 a pass has more, 2 forwards
-- wait, 4 a topic's fan-out is unfinished) and hold_until. When there are subscription keys whose pass has
-- more (a topic's scripts) or pushes for the calling process's consumers (outbox.push_replies), flag 8 says
-- so and they come before those three, flat, followed by their two counts (a nested array in a reply costs
-- Redis a conversion of its own). Appends to `out` and returns it.
function dispatch.add_tail(out, dispatched, flags, hold, more_keys)
  local pushed = outbox.push_replies
  local nkeys = more_keys and #more_keys or 0
  if pushed or nkeys > 0 then
    local n = #out
    for i = 1, nkeys do out[n + i] = more_keys[i] end
    n = n + nkeys
    local npushed = pushed and #pushed or 0
    for i = 1, npushed do out[n + i] = pushed[i] end
    n = n + npushed
    out[n + 1] = nkeys
    out[n + 2] = npushed
    flags = flags + 8
  end
  out[#out + 1] = dispatched
  out[#out + 1] = flags
  out[#out + 1] = hold
  return out
end
