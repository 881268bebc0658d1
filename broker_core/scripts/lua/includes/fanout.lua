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
--   :fanout:<id>   list  subscription keys in the order the dispatch policy visited them at a send (the
--                        subscriptions of that moment: one made later does not get its messages, one
--                        gone meanwhile is skipped), then `w.<pattern>` for each matching wildcard
--                        pattern still to decide (a subscription key is `c.` or `d.` and more, topics.py),
--                        in the order wildcard.matching sorts them. While the priority policy's order
--                        is built, the entry topic.UNBUILT stands for the subscription keys; while the
--                        patterns' trie is built, 'w.' (wildcard.UNBUILT) for the patterns: each replaced
--                        when its build is complete (fanout.unbuilt, fanout.unbuilt_patterns). One list
--                        per send, shared by the messages it queued with every pattern left to decide (a
--                        first message that decided some has one of its own):
--                        each reads it from its own index on (:fanout:at), none pops it. It is named after
--                        the last of them, which finishes last (fan-outs finish in send order) and deletes
--                        it; so :fanout's ids name every list there is (destination_delete.lua)
--   :fanout:at     hash  id -> "<index of the next key to visit>|<the id naming its list>"; none: its own
--                        list from its head (a send's last message, a single one cut; and any queued
--                        before session 30, whose lists were popped)
--   :fanout:n      hash  id -> "<subscriptions that took it so far>|<wildcard copies>", then "|<job id>"
--                        for a firing of the topic's job (its enqueue names the job)
--@include dispatch
--@include topic

-- Its module table `fanout` (one table, not locals: the scripts' main chunk is close to Lua's 200 locals)
-- `list`, `front`, `queued`: the send's list (fanout.defer), the index in `subs` of its first key, and the
-- messages queued so far, {id, first index in `subs`} each; `wild`: the continuation's wildcard.reader.
local fanout = { visits = 0, tries = 0, list = false, front = 0, queued = {}, wild = false }
--@on-call
fanout.visits, fanout.tries, fanout.list, fanout.front, fanout.wild = 0, 0, false, 0, false
if next(fanout.queued) ~= nil then fanout.queued = {} end  -- (an empty one is as good as a new one)
--@on-call-end
-- What one call (a send, or a continuation) does at most, whatever the selector work: a topic's
-- subscriptions are not limited in number. One that takes messages costs the call about 0.13 ms (its
-- pending list, its dispatch chunk, the slow and pending-limit rules), so a call gives messages to at most
-- MAX_TAKERS of them; a continuation also visits at most MAX_VISITS (a definition read and decoded each:
-- a send has them all decoded already).
fanout.MAX_VISITS = 2000
fanout.MAX_TAKERS = 32
-- How many keys a continuation reads from a list at once (LRANGE): a call's visit may stop anywhere in them.
fanout.READ = 100

-- A send tries its messages against the subscriptions whose definitions it read at most MAX_TRIES times
-- (fanout.tried): a try that refuses cheaply (a selector reading one small property, noLocal) costs the
-- selector budget little and takes nothing, so neither bound above stops it, and a batch of 100 messages
-- to 2,000 such subscriptions was one call of 234 ms (about 1.2 us a try; docs/benchmarks.md "Session 30:
-- cheap refusals"). The rest go to the fan-out's calls, which visit at most MAX_VISITS.
fanout.MAX_TRIES = 4000

-- Must the call stop matching here? `takers`: the subscriptions that took messages in this call so far.
function fanout.full(takers)
  return fanout.spent() or takers >= fanout.MAX_TAKERS or fanout.tries >= fanout.MAX_TRIES
end

-- The send tried a message against one subscription.
function fanout.tried()
  fanout.tries = fanout.tries + 1
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
-- none), then the wildcard patterns `patterns` still to decide (wildcard.takers: those it did not decide;
-- all of them, the send's wildcard.for_send list, for a message deferred before: `every` says which).
-- `copies`: the wildcard patterns that got a copy. The send's call ends with fanout.seal.
function fanout.defer(id, blob, seq, matched, subs, from, copies, job, unread, patterns, every)
  topic.store(id, blob, topic.refs_of(matched) + 1, seq)
  if every then
    fanout.cover(id, subs, from, unread, patterns)
    fanout.queued[#fanout.queued + 1] = { id, from }
  else  -- (a first message that decided some patterns: a list of its own, read from its head)
    local list = base.TP .. ':fanout:' .. id
    fanout.list_keys(list, subs, from, unread)
    fanout.list_patterns(list, patterns)
  end
  redis.call('RPUSH', base.TP .. ':fanout', id)
  redis.call('HSET', base.TP .. ':fanout:n', id, #matched .. '|' .. copies .. (job and '|' .. job or ''))
end

-- Make the send's one list hold the keys of `subs` from `from` on, then `unread`'s, then `patterns`
-- (every matching one: the same for each message that shares the list). Every message a send
-- queues after its first has the same subscriptions from the first on (only the first can be cut part way),
-- so the list is made once, by the first (named after it until fanout.seal), and a later one at most
-- pushes the keys before the first's cut in front: a batch costs the call one list, not one per message
-- (a COPY of 10,000 keys each made 100 messages one call of 36 ms).
function fanout.cover(id, subs, from, unread, patterns)
  if not fanout.list then
    fanout.list, fanout.front = base.TP .. ':fanout:' .. id, from
    fanout.list_keys(fanout.list, subs, from, unread)
    fanout.list_patterns(fanout.list, patterns)
  elseif from < fanout.front then
    local keys = {}
    for k = fanout.front - 1, from, -1 do keys[#keys + 1] = subs[k].key end  -- (LPUSH puts each one in front)
    base.call_many('LPUSH', fanout.list, keys)
    fanout.front = from
  end
end

-- The send's messages are queued: its list takes the name of the last of them, which finishes last, and
-- each other one notes where in it it starts (:fanout:at).
function fanout.seal()
  local last = fanout.queued[#fanout.queued]
  if not last then return end
  local owner = last[1]
  local list = base.TP .. ':fanout:' .. owner
  if fanout.list ~= list and redis.call('EXISTS', fanout.list) == 1 then redis.call('RENAME', fanout.list, list) end
  local at = {}
  for k = 1, #fanout.queued - 1 do  -- (the last reads its own list from the head: the front, from 1 on)
    local q = fanout.queued[k]
    at[#at + 1] = q[1]
    at[#at + 1] = (q[2] - fanout.front) .. '|' .. owner
  end
  base.call_many('HSET', base.TP .. ':fanout:at', at)
end

-- Where message `id`'s fan-out goes on: the index of its next key, and the id naming its list.
function fanout.position(id)
  local at = redis.call('HGET', base.TP .. ':fanout:at', id)
  if not at then return 0, id end
  local index, owner = string.match(at, '^(%d+)|(.*)$')
  return tonumber(index), owner
end

-- List in `list` the keys of `subs` from index `from` on, then those of `unread`'s ranges of its list: the
-- first range copied by the server (COPY, then LTRIM: a small part of the 0.35 µs a key that reading and
-- pushing them from Lua takes), the keys read before it pushed in front of it.
function fanout.list_keys(list, subs, from, unread)
  if unread and unread.unbuilt then  -- (:sprio not built yet: none read, its keys listed once it is, fanout.run)
    redis.call('RPUSH', list, topic.UNBUILT)
    return
  end
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

-- Add `w.<pattern>` for each of `patterns` at the end of `list`.
function fanout.list_patterns(list, patterns)
  local entries = {}
  for q = 1, #patterns do entries[q] = 'w.' .. patterns[q] end
  base.call_many('RPUSH', list, entries)
end

-- Record the copies of message `id` owed to `patterns` (wildcard.takers) in the forwarding hash
-- (wildcard.record); the caller delivers them (flag 2), an event `forward` each.
function fanout.copy(found, id, blob, patterns)
  wildcard.record(id, blob, found.uri, patterns)
  forward.n = forward.n + #patterns
  for _, pattern in ipairs(patterns) do base.emit('forward', 'msg', id, 'target', 'topic://' .. pattern) end
end

-- Decide wildcard pattern `pattern` for queued message (id, m, blob), in this call's wildcard.reader
-- (wildcard.takers): its copy recorded if some subscription of it takes the message, or if the call
-- cannot decide. Returns whether it got a copy (fanout.run counts it in :fanout:n), and the selector view.
function fanout.pattern(id, m, blob, pattern, view)
  fanout.visits = fanout.visits + 1
  fanout.wild = fanout.wild or wildcard.reader()
  local takers
  takers, view = wildcard.takers(fanout.wild, { pattern }, id, m, view, topic.matches, fanout.spent)
  if #takers > 0 then fanout.copy(fanout.wild, id, blob, takers) end
  return #takers > 0, view
end

-- Has this call decided as many wildcard patterns as a call may (wildcard.MAX_PATTERNS)?
function fanout.patterns_full()
  return fanout.wild and fanout.wild.decided >= wildcard.MAX_PATTERNS
end

-- Message `id`'s fan-out is done: its events, as a send that matched at once writes them, and the
-- fan-out's reference let go (the message goes with it if nobody took it). `n`: its :fanout:n entry, with
-- the subscriptions that took it in this call added; `owner`: the id naming its list.
function fanout.finish(id, m, blob, n, owner)
  redis.call('LPOP', base.TP .. ':fanout')
  redis.call('HDEL', base.TP .. ':fanout:n', id)
  redis.call('HDEL', base.TP .. ':fanout:at', id)
  if owner == id then redis.call('DEL', base.TP .. ':fanout:' .. id) end  -- (the last to read it)
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

-- Has this call visited as many subscriptions, or served as many, or decided as many wildcard patterns
-- (wildcard.MAX_PATTERNS), as it may?
function fanout.stop(order)
  return fanout.full(#order) or fanout.visits >= fanout.MAX_VISITS or fanout.patterns_full()
end

-- Does subscription `key` take message (id, m), sent with topic sequence `seq`? If so it gets it in
-- `touched` and `order` (fanout.run), with the fan-out's reference on it. Returns whether it took it, and
-- the message's selector view.
function fanout.visit(key, id, m, seq, view, touched, order)
  fanout.visits = fanout.visits + 1
  local def = redis.call('HGET', base.TP .. ':subs', key)
  if not def then return false, view end  -- (gone since the send: skipped)
  local s = { key = key, def = cmsgpack.unpack(def) }
  -- (made after the send: the key was made again since, another subscription; a subscription stored
  -- before `since` existed has none, and is older than any fan-out that reads it)
  if seq and seq <= (tonumber(s.def.since) or -1) then return false, view end
  -- (a selector's compiled form is decoded for the call too: such a visit costs about two of one without,
  -- so it counts twice; 2,000 of them made a call of 20 ms)
  if type(s.def.selector) == 'string' and s.def.selector ~= '' then fanout.visits = fanout.visits + 1 end
  local ok
  ok, view = topic.matches(s, id, m, view)
  if not ok then return false, view end
  redis.call('HINCRBY', base.TP .. ':refs', id, lifecycle.ref_weight(key))
  if not touched[key] then
    touched[key] = { s = s, ids = {}, msgs = {} }
    order[#order + 1] = key
  end
  local entry = touched[key]
  entry.ids[#entry.ids + 1] = id
  entry.msgs[#entry.msgs + 1] = m
  return true, view
end

-- List entry topic.UNBUILT at index `at` of `list` reached: the subscriptions in the priority policy's
-- order, :sprio, still being built when the send listed them (topic.subscriptions). A slice of the build
-- (topic.index_ready); once complete, the entry is replaced by :sprio's keys (the server's copy, the
-- entries around it pushed on each side: the patterns after it, none before it). Either way the call's
-- visits are spent: the next call reads the list from there. The keys are those of that moment: one made
-- since the send is passed by, one gone is skipped (fanout.visit).
function fanout.unbuilt(list, at)
  fanout.visits = fanout.MAX_VISITS
  if not topic.index_ready() then return end
  local before = at > 0 and redis.call('LRANGE', list, 0, at - 1) or {}
  local after = redis.call('LRANGE', list, at + 1, -1)
  local made = list .. ':sprio'
  redis.call('COPY', base.TP .. ':sprio', made, 'REPLACE')
  local front = {}
  for k = #before, 1, -1 do front[#front + 1] = before[k] end  -- (LPUSH puts each one in front)
  base.call_many('LPUSH', made, front)
  base.call_many('RPUSH', made, after)
  if redis.call('EXISTS', made) == 1 then redis.call('RENAME', made, list) else redis.call('DEL', list) end
end

-- List entry 'w.' .. wildcard.UNBUILT at index `at` of `list` reached (the last one: patterns come last,
-- and a send lists it alone): the patterns matching the topic, not known at the send while the registry's
-- trie was built (wildcard.for_send). A slice of the build; once complete, the entry is replaced by the
-- matching patterns of that moment. Either way the call's visits are spent, as for fanout.unbuilt.
function fanout.unbuilt_patterns(list, at)
  fanout.visits = fanout.MAX_VISITS
  local ns, name = wildcard.topic_name()
  local patterns = wildcard.matching(ns, name)
  if not patterns then return end
  local after = redis.call('LRANGE', list, at + 1, -1)
  if at > 0 then redis.call('LTRIM', list, 0, at - 1) else redis.call('DEL', list) end
  fanout.list_patterns(list, patterns)
  base.call_many('RPUSH', list, after)
end

-- Go on with the queued fan-outs, oldest first, until the call is full (fanout.stop). Each message reads
-- its list from its own index on (fanout.READ keys at a time), and notes where it stopped. The
-- subscriptions that took messages get them in `touched` ({s, ids, msgs} per key) and `order`, for the
-- caller to add and dispatch. Returns how many messages' fan-outs it finished.
function fanout.run(touched, order)
  local finished = 0
  while not fanout.stop(order) do
    local id = redis.call('LINDEX', base.TP .. ':fanout', 0)
    if not id then break end
    local blob = redis.call('HGET', base.TP .. ':msgs', id)
    local m = blob and message.unpack(blob)
    local seq = m and tonumber(redis.call('ZSCORE', base.TP .. ':order', id))
    local n = redis.call('HGET', base.TP .. ':fanout:n', id) or '0|0'
    local index, owner = fanout.position(id)
    local start, list = index, base.TP .. ':fanout:' .. owner
    local took, copied, view, done = 0, 0, nil, m == nil  -- (a message gone meanwhile: nobody to give it to)
    while not done and not fanout.stop(order) do
      local keys = redis.call('LRANGE', list, index, index + fanout.READ - 1)
      done = #keys < fanout.READ
      for _, key in ipairs(keys) do
        if fanout.stop(order) then
          done = false
          break
        end
        local ok
        if key == topic.UNBUILT or key == 'w.' .. wildcard.UNBUILT then
          if key == topic.UNBUILT then fanout.unbuilt(list, index) else fanout.unbuilt_patterns(list, index) end
          done = false
          break
        elseif string.sub(key, 1, 2) == 'w.' then  -- (a wildcard pattern still to decide, after the keys)
          ok, view = fanout.pattern(id, m, blob, string.sub(key, 3), view)
          if ok then copied = copied + 1 end
        else
          ok, view = fanout.visit(key, id, m, seq, view, touched, order)
          if ok then took = took + 1 end
        end
        index = index + 1
      end
    end
    local matched, copies, job = string.match(n, '^(%d+)|(%d+)(.*)$')  -- (job: a firing's, "|<job id>")
    n = (tonumber(matched) + took) .. '|' .. (tonumber(copies) + copied) .. job
    if not done then
      if took > 0 or copied > 0 then redis.call('HSET', base.TP .. ':fanout:n', id, n) end
      if index > start then redis.call('HSET', base.TP .. ':fanout:at', id, index .. '|' .. owner) end
      break
    end
    fanout.finish(id, m, blob, n, owner)
    finished = finished + 1
  end
  return finished
end
