-- A topic send's fan-out continued across calls (issue 21; docs/broker_core.md "A send's fan-out in
-- slices"). Matching one message against its subscriptions' selectors costs up to max_evaluation_bytes
-- per subscription, so a send matches until its selector work reaches a call's worth
-- (selector.call_limit, selector.lua) and leaves the rest of the subscriptions, and every later
-- message, to the calls after it (topic_fanout.lua): by the sender, or by the maintenance tick's recovery
-- when the sender died. Each message is stored once when it is sent, with one reference held for the
-- fan-out until it is done, so nothing is lost between calls.
--
-- Order per subscription: messages are matched strictly in the order they were sent. While any message's
-- fan-out is unfinished, a new send matches nothing itself and queues behind it, so no later message
-- reaches a subscription before an earlier one.
--
-- Keys under the topic prefix TP:
--   :fanout        list  ids of sent messages whose fan-out is unfinished, in send order
--   :fanout:<id>   list  the subscription keys message <id> is still to be matched against, in the
--                        order the dispatch policy visited them at the send (the subscriptions of that
--                        moment: one made later does not get it, one gone meanwhile is skipped), then
--                        `w.<pattern>` for each matching wildcard pattern still to decide (a subscription
--                        key is `c.` or `d.` and more, topics.py), in the order wildcard.matching sorts them
--   :fanout:n      hash  id -> "<subscriptions that took it so far>|<wildcard copies>", then "|<job id>"
--                        for a firing of the topic's job (its enqueue names the job)
--@include dispatch
--@include topic

-- Its module table `fanout` (one table, not locals: the scripts' main chunk is close to Lua's 200 locals)
local fanout = { visits = 0, whole = false, whole_patterns = false, wild = false }
--@on-call
fanout.visits, fanout.whole, fanout.whole_patterns, fanout.wild = 0, false, false, false
--@on-call-end
-- What one call (a send, or a continuation) does at most, whatever the selector work: a topic's
-- subscriptions are not limited in number. One that takes messages costs the call about 0.13 ms (its
-- pending list, its dispatch chunk, the slow and pending-limit rules), so a call gives messages to at most
-- MAX_TAKERS of them; a continuation also visits at most MAX_VISITS (a definition read and decoded each:
-- a send has them all decoded already).
fanout.MAX_VISITS = 2000
fanout.MAX_TAKERS = 32

-- Must the call stop matching here? `takers`: the subscriptions that took messages in this call so far.
function fanout.full(takers)
  return fanout.spent() or takers >= fanout.MAX_TAKERS
end

-- Has this call's selector work reached a call's worth? (forward.lua; checked before each evaluation, so
-- a call does at most one evaluation more: call_limit + max_evaluation_bytes in all)
fanout.spent = forward.work_spent

-- Is a fan-out unfinished? Then a send queues behind it.
function fanout.waiting()
  return redis.call('LLEN', base.TP .. ':fanout') > 0
end

-- Queue message `id` (sent with topic sequence `seq`): stored now, with one reference for each
-- subscription in `matched` (which take it in this call) and one for the fan-out; the subscriptions
-- `subs` from index `from` on are matched later, then those whose definitions the send did not read,
-- `unread` (topic.subscriptions: ranges of the indexes of the list it visited, :sorder or :sprio, nil for
-- none), then the wildcard patterns `patterns` (wildcard.takers: those it did not decide; all of them,
-- the send's wildcard.for_send list, for a message deferred before). `copies`: the wildcard patterns that
-- got a copy.
function fanout.defer(id, blob, seq, matched, subs, from, copies, job, unread, patterns)
  topic.store(id, blob, topic.refs_of(matched) + 1, seq)
  local list = base.TP .. ':fanout:' .. id
  if from == 1 and fanout.whole and patterns == fanout.whole_patterns then
    -- (a later message of the send, past the cut: every subscription and pattern, listed for an earlier one)
    redis.call('COPY', fanout.whole, list)
  else
    fanout.list_keys(list, subs, from, unread)
    for k = 1, #patterns, 1000 do  -- (unpack() has a limit)
      local entries = {}
      for q = k, math.min(k + 999, #patterns) do entries[#entries + 1] = 'w.' .. patterns[q] end
      redis.call('RPUSH', list, unpack(entries))
    end
    if from == 1 then fanout.whole, fanout.whole_patterns = list, patterns end
  end
  redis.call('RPUSH', base.TP .. ':fanout', id)
  redis.call('HSET', base.TP .. ':fanout:n', id, #matched .. '|' .. copies .. (job and '|' .. job or ''))
end

-- List in `list` the keys of `subs` from index `from` on, then those of `unread`'s ranges of its list: the
-- first range copied by the server (COPY, then LTRIM: a small part of the 0.35 µs a key that reading and
-- pushing them from Lua takes), the keys read before it pushed in front of it.
function fanout.list_keys(list, subs, from, unread)
  local keys = {}
  if unread then
    redis.call('COPY', unread.list, list)
    redis.call('LTRIM', list, unread[1], unread[2])
    for k = #subs, from, -1 do keys[#keys + 1] = subs[k].key end  -- (LPUSH puts each one in front)
  else
    for k = from, #subs do keys[#keys + 1] = subs[k].key end
  end
  for k = 1, #keys, 1000 do  -- unpack() has a limit
    redis.call(unread and 'LPUSH' or 'RPUSH', list, unpack(keys, k, math.min(k + 999, #keys)))
  end
  for r = 3, #(unread or {}), 2 do  -- (roundRobin's wrap round: the head of :sorder)
    for k = unread[r], unread[r + 1], 1000 do
      redis.call('RPUSH', list, unpack(redis.call('LRANGE', unread.list, k, math.min(k + 999, unread[r + 1]))))
    end
  end
end

-- Record the copies of message `id` owed to `patterns` (wildcard.takers) in the forwarding hash
-- (wildcard.record); the caller delivers them (flag 2), an event `forward` each.
function fanout.copy(found, id, blob, patterns)
  wildcard.record(id, blob, found.uri, patterns)
  forward.n = forward.n + #patterns
  for _, pattern in ipairs(patterns) do base.emit('forward', 'msg', id, 'target', 'topic://' .. pattern) end
end

-- Decide wildcard pattern `pattern` for queued message (id, m, blob), in this call's wildcard.reader
-- (wildcard.takers): its copy recorded and counted in :fanout:n if some subscription of it takes the
-- message, or if the call cannot decide. Returns the selector view.
function fanout.pattern(id, m, blob, pattern, view)
  fanout.wild = fanout.wild or wildcard.reader()
  local takers
  takers, view = wildcard.takers(fanout.wild, { pattern }, id, m, view, topic.matches, fanout.spent)
  if #takers > 0 then
    fanout.copy(fanout.wild, id, blob, takers)
    local n = redis.call('HGET', base.TP .. ':fanout:n', id) or '0|0'
    local matched, copies, rest = string.match(n, '^(%d+)|(%d+)(.*)$')  -- (rest: a firing's job)
    redis.call('HSET', base.TP .. ':fanout:n', id, matched .. '|' .. (tonumber(copies) + 1) .. rest)
  end
  return view
end

-- Has this call decided as many wildcard patterns as a call may (wildcard.MAX_PATTERNS)?
function fanout.patterns_full()
  return fanout.wild and fanout.wild.decided >= wildcard.MAX_PATTERNS
end

-- Message `id`'s fan-out is done: its events, as a send that matched at once writes them, and the
-- fan-out's reference let go (the message goes with it if nobody took it).
function fanout.finish(id, m, blob)
  redis.call('LPOP', base.TP .. ':fanout')
  local n = redis.call('HGET', base.TP .. ':fanout:n', id) or '0|0'
  redis.call('HDEL', base.TP .. ':fanout:n', id)
  local matched, copies, job = string.match(n, '^(%d+)|(%d+)|?(.*)$')
  if job == '' then job = nil end
  matched, copies = tonumber(matched) or 0, tonumber(copies) or 0
  if m then
    local priority, size = base.NOW_TEXT.num(m[message.PRIORITY] or 4), base.NOW_TEXT.num(#blob)
    if matched == 0 and copies == 0 then
      base.meta_incr('no_subscription')
      base.emit('no_subscription', 'msg', id, 'priority', priority, 'size', size)
      advisory.no_consumer(id, blob, m[message.PERSISTENT])
    elseif copies == 0 then
      topic.enqueued(id, m, #blob, job, 'subscriptions', matched)
    else
      topic.enqueued(id, m, #blob, job, 'subscriptions', matched, 'wildcards', copies)
    end
    lifecycle.release_shared(id, 1)  -- (the fan-out's own reference: no subscription's)
  end
end

-- Go on with the queued fan-outs, oldest first, until the call is full (fanout.full, MAX_VISITS, and
-- wildcard.MAX_PATTERNS patterns decided).
-- The subscriptions that took messages get them in `touched` ({s, ids, msgs} per key) and `order`, for
-- the caller to add and dispatch. Returns how many messages' fan-outs it finished.
function fanout.run(touched, order)
  local finished = 0
  while not fanout.full(#order) and fanout.visits < fanout.MAX_VISITS and not fanout.patterns_full() do
    local id = redis.call('LINDEX', base.TP .. ':fanout', 0)
    if not id then break end
    local blob = redis.call('HGET', base.TP .. ':msgs', id)
    local m = blob and message.unpack(blob)
    local list = base.TP .. ':fanout:' .. id
    local view, done = nil, true
    while true do
      if fanout.full(#order) or fanout.visits >= fanout.MAX_VISITS or fanout.patterns_full() then
        done = false
        break
      end
      local key = redis.call('LPOP', list)
      if not key then break end
      fanout.visits = fanout.visits + 1
      local def
      if string.sub(key, 1, 2) == 'w.' then
        if m then view = fanout.pattern(id, m, blob, string.sub(key, 3), view) end
      else
        def = m and redis.call('HGET', base.TP .. ':subs', key)
      end
      if def then
        local s = { key = key, def = cmsgpack.unpack(def) }
        local ok
        ok, view = topic.matches(s, id, m, view)
        if ok then
          redis.call('HINCRBY', base.TP .. ':refs', id, lifecycle.ref_weight(key))
          local n = redis.call('HGET', base.TP .. ':fanout:n', id) or '0|0'
          local matched, rest = string.match(n, '^(%d+)(|.*)$')  -- (the copies, and a firing's job)
          redis.call('HSET', base.TP .. ':fanout:n', id, (tonumber(matched) + 1) .. rest)
          if not touched[key] then
            touched[key] = { s = s, ids = {}, msgs = {} }
            order[#order + 1] = key
          end
          local entry = touched[key]
          entry.ids[#entry.ids + 1] = id
          entry.msgs[#entry.msgs + 1] = m
        end
      end
    end
    if not done then break end
    redis.call('DEL', list)
    fanout.finish(id, m, blob)
    finished = finished + 1
  end
  return finished
end
