-- Topics (spec §7, §8.1, §8.5; docs/broker_core.md "Topics"). Included after base; uses dispatch.
--@include dispatch
--
-- Keys under the topic prefix TP (besides the shared ones in base.lua):
--   :subs    hash  subscription key -> packed definition {selector, selector_text, nolocal, conn, client,
--                  name, durable, priority}
--   :sorder  list  subscription keys in the order they were created (the dispatch policies start here)
--   :sprio   list  subscription keys in the priority dispatch policy's order: by their definitions'
--                  priority, highest first, equal ones as in :sorder (topic.index_add). All of :sorder in
--                  that order when as long and no build is under way; a topic's subscriptions made before
--                  it existed get it built in slices (topic.index_ready), priority sends waiting meanwhile.
--   :sprio:build  zset  while :sprio is built: the keys walked and not yet moved to :sprio, scored by
--                  priority and walk order (index_score); meta 'sprio_walk' (keys of :sorder walked, while
--                  walking), 'sprio_moved' (the score of the last key moved to :sprio, while moving),
--                  'sprio_seq' (the walk order's counter)
--   :subof   hash  consumer id -> subscription key (how a ConsumerRef finds its subscription)
--   :refs    hash  message id -> the references of the subscriptions that still hold it (the message is in
--                  :msgs once): 1 each, DURABLE_REF a durable one's (lifecycle.lua ref_weight)
--   :order   zset  stored message id -> topic sequence (a new retroactive durable catches up from it)
--   :retain  hash  the ActiveMQ.Retain message: id, blob
--   :recov   zset  id -> topic sequence of what the recovery policy keeps; :recovmsg hash id -> {blob, ts}
-- Each subscription is run by the queue scripts under TP .. ':s:' .. key (base.lua, use_prefix); its
-- K_META also holds uri, durable, client, name, selector, active (consumer id), offline_since.
-- Functions live in one table so the including scripts stay under Lua's limit of local variables.

-- Built on a script's first use of one of them (base.lua `lazy`): most scripts that include this file
-- use a few of its functions, and an EVAL script would build them all on every call.
local topic = base.lazy({ selectors = {}, registry_of = false, registry = false }, function(topic)

  -- Forget the registry entry of the current durable subscription (about to be removed), if it is this
  -- topic's: a newer one on another topic keeps its entry.
  function topic.unregister(uri)
    local field = redis.call('HGET', base.K_META, 'regfield')
    if not field or field == '' then
      local names = redis.call('HMGET', base.K_META, 'client', 'name')
      if not names[1] then return end
      field = string.len(names[1]) .. ':' .. names[1] .. (names[2] or '')
    end
    if redis.call('HGET', topic.registry, field) == uri then redis.call('HDEL', topic.registry, field) end
  end

  local TOPIC_POLICY_NAMES = {
    'dispatchPolicy', 'topicPrefetch', 'durableTopicPrefetch', 'subscriptionRecoveryPolicy',
    'subscriptionRecoveryMaximumSize', 'recoverDuration', 'alwaysRetroactive', 'pendingMessageLimitStrategy',
    'pendingMessageLimit', 'pendingMessageLimitMultiplier', 'messageEvictionStrategy',
    'evictExpiredMessagesHighWatermark', 'evictionPropertyName', 'offlineDurableSubscriberTimeout',
  }
  local TOPIC_POLICY_DEFAULTS = {
    'simple', '32767', '100', 'retainedMessage', '-1', '60000', '0', 'none', '-1', '0.5', 'oldestMessage',
    '1000', '', '-1',
  }

  -- A message's `enqueue` event on the topic, with the counts that follow it (`...`); `job`: the job it is
  -- a firing of (topic_send.lua), named as a queue's firing names it (lifecycle.lua fire_scheduled).
  function topic.enqueued(id, m, size, job, ...)
    local priority, group = base.NOW_TEXT.num(m[message.PRIORITY] or 4), m[message.GROUP] or ''
    if job then
      base.emit('enqueue', 'msg', id, 'priority', priority, 'group', group, 'size', base.NOW_TEXT.num(size),
                'scheduled', job, ...)
    else
      base.emit('enqueue', 'msg', id, 'priority', priority, 'group', group, 'size', base.NOW_TEXT.num(size), ...)
    end
  end

  function topic.policy()
    if topic._policy then return topic._policy end
    local values = redis.call('HMGET', base.TP .. ':policy', unpack(TOPIC_POLICY_NAMES))
    topic._policy = base.with_defaults(TOPIC_POLICY_NAMES, TOPIC_POLICY_DEFAULTS, values)
    return topic._policy
  end

  -- Work on subscription `key` (or, with nil, on the topic itself). Per-prefix caches start over.
  function topic.switch(key)
    if key then base.use_prefix(base.TP .. ':s:' .. key) else base.use_prefix(base.TP) end
    lifecycle.parked.next = nil
    message.pass_dirty.value = false
  end

  -- Append the subscriptions of `keys` (those with a definition) to `subs`.
  local function read_definitions(keys, subs)
    -- unpack() has a limit (~8000 values), so the definitions are read in slices.
    for from = 1, #keys, 1000 do
      local upto = math.min(from + 999, #keys)
      local defs = redis.call('HMGET', base.TP .. ':subs', unpack(keys, from, upto))
      for i = from, upto do
        local def = defs[i - from + 1]
        if def then subs[#subs + 1] = { key = keys[i], def = cmsgpack.unpack(def) } end
      end
    end
    return subs
  end

  -- A definition's priority, as PriorityDispatchPolicy compares them (a missing one is 0).
  local function priority_of(def)
    return tonumber(def.priority) or 0
  end

  -- The priority of the subscription at index `at` of :sprio (a listed key always has its definition:
  -- both go in one step).
  local function priority_at(at)
    local def = redis.call('HGET', base.TP .. ':subs', redis.call('LINDEX', base.TP .. ':sprio', at))
    return def and priority_of(cmsgpack.unpack(def)) or 0
  end

  -- The first index in [lo, hi) of :sprio where `holds` (false before it, true from it on), hi if none: a
  -- binary search, about 14 reads at 10,000.
  local function first_where(lo, hi, holds)
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if holds(mid) then hi = mid else lo = mid + 1 end
    end
    return lo
  end

  -- Put `key` at index `at` of :sprio, of `n` (LINSERT scans to its place on the server, as LREM does
  -- when one goes).
  local function index_put(key, at, n)
    local K_SPRIO = base.TP .. ':sprio'
    if at >= n then
      redis.call('RPUSH', K_SPRIO, key)
    else
      redis.call('LINSERT', K_SPRIO, 'BEFORE', redis.call('LINDEX', K_SPRIO, at), key)
    end
  end

  -- Building :sprio for a topic whose subscriptions were made before it existed, in slices of at most
  -- INDEX_SLICE keys a call (reading every definition in one call took 37 ms at 10,000): first a walk of
  -- :sorder from its head, each key with a definition scored into :sprio:build by its priority, highest
  -- first, and its walk order (equal priorities stay in :sorder's order: PriorityDispatchPolicy's stable
  -- sort); then the keys moved from :sprio:build to :sprio, lowest score first. A subscription made,
  -- removed (lifecycle.lua remove_subscription) or back with another priority meanwhile is taken into
  -- account where the build is (topic.index_add, topic.index_move).
  topic.INDEX_SLICE = 1000
  -- (scores: -priority * ORDER_SPAN + walk order, exact in a double for priorities -128..127)
  local ORDER_SPAN = 4294967296

  local function K_BUILD() return base.TP .. ':sprio:build' end

  local function index_score(p, order)
    return -p * ORDER_SPAN + order
  end

  -- Where a build is: the keys of :sorder walked (while walking), the score of the last key moved
  -- ('-inf' before the first, while moving); nil, nil when none is under way.
  local function build_state()
    local state = redis.call('HMGET', base.TP .. ':meta', 'sprio_walk', 'sprio_moved')
    return state[1], state[2]
  end

  local function build_start()
    redis.call('DEL', base.TP .. ':sprio', K_BUILD())
    redis.call('HSET', base.TP .. ':meta', 'sprio_walk', 0, 'sprio_seq', 0)
    redis.call('HDEL', base.TP .. ':meta', 'sprio_moved')
  end

  -- Put new subscription `key` (its definition `def`, its key already at the end of :sorder) in :sprio:
  -- after every one of the same or a higher priority (it is the newest, last of its equals in the stable
  -- sort). At the end when the last one's priority is not lower (all of a topic's subscriptions at the
  -- default priority: six commands); else before the first of a lower priority. Done whatever the
  -- policy, so a topic switched to `priority` has its order ready.
  -- While :sprio is built (topic.index_ready): nothing while walking (the walk reaches the key, at the end
  -- of :sorder); while moving, to :sprio:build when its place is among the keys not moved yet, else into
  -- :sprio as below (every key of a higher or the same priority is there). Before a build, nothing.
  function topic.index_add(key, def)
    local p = priority_of(def)
    local walk, moved = build_state()
    if walk then return end
    local n = redis.call('LLEN', base.TP .. ':sprio')
    if moved then
      local score = index_score(p, redis.call('HINCRBY', base.TP .. ':meta', 'sprio_seq', 1))
      if moved == '-inf' or score > tonumber(moved) then
        redis.call('ZADD', K_BUILD(), score, key)
        return
      end
    elseif n ~= redis.call('LLEN', base.TP .. ':sorder') - 1 then
      return
    end
    if n == 0 or priority_at(n - 1) >= p then
      redis.call('RPUSH', base.TP .. ':sprio', key)
      return
    end
    index_put(key, first_where(0, n - 1, function(at) return priority_at(at) < p end), n)
  end

  -- Move durable subscription `key`, back with definition `def` of another priority, to its place in
  -- :sprio: after every one of a higher priority, and among its equals where :sorder has it (the stable
  -- sort of Topic.consumers, in which a reactivated durable subscription kept its place). A probe among
  -- the equals finds their places in :sorder with LPOS, a scan on the server: this runs only when a
  -- subscriber comes back with another priority. While :sprio is built (topic.index_ready): a key walked
  -- already is scored again, keeping its walk order; one not walked yet is read by the walk; while moving
  -- the build starts over (rare: a return with another priority). Before a build, nothing.
  function topic.index_move(key, def)
    local K_SPRIO, K_LIST = base.TP .. ':sprio', base.TP .. ':sorder'
    local walk, moved = build_state()
    if walk then
      local score = redis.call('ZSCORE', K_BUILD(), key)
      if score then
        redis.call('ZADD', K_BUILD(), index_score(priority_of(def), tonumber(score) % ORDER_SPAN), key)
      end
      return
    elseif moved then
      build_start()
      return
    end
    if redis.call('LLEN', K_SPRIO) ~= redis.call('LLEN', K_LIST) then return end
    redis.call('LREM', K_SPRIO, 1, key)
    local p, n = priority_of(def), redis.call('LLEN', K_SPRIO)
    local equals = first_where(0, n, function(at) return priority_at(at) <= p end)
    local mine = redis.call('LPOS', K_LIST, key)
    index_put(key, first_where(equals, n, function(at)
      return priority_at(at) < p or redis.call('LPOS', K_LIST, redis.call('LINDEX', K_SPRIO, at)) > mine
    end), n)
  end

  -- Walk at most `most` keys of :sorder from index `at`; returns how many of `most` are left.
  local function build_walk(at, most)
    local keys = redis.call('LRANGE', base.TP .. ':sorder', at, at + most - 1)
    local subs = read_definitions(keys, {})
    if #subs < #keys then  -- (a key listed without its definition, no subscription: off the list, as
      local have = {}      -- topic_admin's delete does, or :sprio would never be as long)
      for _, s in ipairs(subs) do have[s.key] = true end
      for _, key in ipairs(keys) do
        if not have[key] then redis.call('LREM', base.TP .. ':sorder', 1, key) end
      end
    end
    local seq = redis.call('HINCRBY', base.TP .. ':meta', 'sprio_seq', #subs) - #subs
    local scored = {}
    for i, s in ipairs(subs) do
      scored[#scored + 1] = index_score(priority_of(s.def), seq + i)
      scored[#scored + 1] = s.key
    end
    base.call_many('ZADD', K_BUILD(), scored)
    if #keys < most then  -- (walked: keys made from now on go by topic.index_add)
      redis.call('HDEL', base.TP .. ':meta', 'sprio_walk')
      redis.call('HSET', base.TP .. ':meta', 'sprio_moved', '-inf')
    else
      redis.call('HSET', base.TP .. ':meta', 'sprio_walk', at + #subs)
    end
    return most - #keys
  end

  -- Move at most `most` keys from :sprio:build to the end of :sprio; returns whether the build is done.
  local function build_move(most)
    local popped = redis.call('ZPOPMIN', K_BUILD(), most)
    local keys = {}
    for i = 1, #popped, 2 do keys[#keys + 1] = popped[i] end
    base.call_many('RPUSH', base.TP .. ':sprio', keys)
    if redis.call('EXISTS', K_BUILD()) == 1 then
      redis.call('HSET', base.TP .. ':meta', 'sprio_moved', popped[#popped])
      return false
    end
    redis.call('HDEL', base.TP .. ':meta', 'sprio_moved', 'sprio_seq')
    return true
  end

  -- Is :sprio all of :sorder in the priority policy's order? If not, a slice of its build is done here
  -- (started when none is under way): returns whether it is complete now. A topic of up to 500
  -- subscriptions is built in one call.
  function topic.index_ready()
    local walk, moved = build_state()
    if not walk and not moved then
      if redis.call('LLEN', base.TP .. ':sprio') == redis.call('LLEN', base.TP .. ':sorder') then return true end
      build_start()
      walk = 0
    end
    local most = topic.INDEX_SLICE
    if walk then most = build_walk(tonumber(walk), most) end
    if most <= 0 then return false end
    return build_move(most)
  end

  -- What topic.subscriptions returns for the keys not read while :sprio is built: the send's fan-out lists
  -- UNBUILT, and lists :sprio's keys in its place once it is complete (fanout.run).
  topic.UNBUILT = 'sprio'

  -- The subscriptions in the order the topic's dispatch policy visits them (§7.1), for a send: every
  -- matching one gets the message whatever the policy; the policy only orders the deliveries of one send.
  -- A send matches at most a call's worth of them (includes/fanout.lua), so only the first `most`
  -- definitions are read, in the visiting order: :sorder's under the simple and strictOrder policies,
  -- from a turning start under roundRobin (wrapping round), :sprio's under priority. The keys of the
  -- others are returned too, as ranges of the list's indexes {first, last, ..., list = its key} in
  -- visiting order (nil when none is left), for fanout.defer to copy.
  -- A priority topic whose :sprio is not complete (made before :sprio existed) has a slice of its build
  -- done (topic.index_ready); while it is not complete, no definition is read and every subscription is
  -- left to the fan-out, as { unbuilt = true } (fanout.list_keys): its messages wait for the build there.
  function topic.subscriptions(most)
    local dispatch_policy = topic.policy()['dispatchPolicy']
    local K_LIST = base.TP .. ':sorder'
    if dispatch_policy == 'priority' then
      if not topic.index_ready() then return {}, { unbuilt = true } end
      K_LIST = base.TP .. ':sprio'
    end
    local keys = redis.call('LRANGE', K_LIST, 0, most - 1)
    local n = #keys < most and #keys or redis.call('LLEN', K_LIST)
    local turn = 0
    if dispatch_policy == 'roundRobin' and n > 1 then
      -- RoundRobinDispatchPolicy: the first visited moves to the back for the next send.
      turn = redis.call('HINCRBY', base.TP .. ':meta', 'rr', 1) % n
      if n <= most then  -- all read: turned here
        local turned = {}
        for i = 1, n do turned[i] = keys[((i - 1 + turn) % n) + 1] end
        keys = turned
      else
        keys = redis.call('LRANGE', K_LIST, turn, turn + most - 1)
        if #keys < most then  -- (wrapped round to the head)
          for _, key in ipairs(redis.call('LRANGE', K_LIST, 0, most - #keys - 1)) do keys[#keys + 1] = key end
        end
      end
    end
    local subs, rest = read_definitions(keys, {}), nil
    local first = turn + #keys  -- (the first index not read, counted past the end when it wrapped)
    if first < n then
      rest = { first, n - 1, list = K_LIST }
      if turn > 0 then rest[3], rest[4] = 0, turn - 1 end
    elseif first - n < turn then
      rest = { first - n, turn - 1, list = K_LIST }
    end
    return subs, rest
  end

  -- Does subscription `s` take message (id, m)? noLocal, then the selector (§7.3, §4).
  function topic.matches(s, id, m, view)
    if s.def.nolocal and s.def.conn and s.def.conn == m[message.CONNECTION] then return false, view end
    local compiled = s.def.selector
    if type(compiled) ~= 'string' or compiled == '' then return true, view end
    local expr = topic.selectors[s.key]
    if not expr then
      expr = cjson.decode(compiled)
      topic.selectors[s.key] = expr
    end
    view = view or message.selector_view(id, m)
    local ok, failed = selector.matches(expr, view)
    if failed then redis.call('HINCRBY', base.TP .. ':meta', 'selector_errors', 1) end
    return ok, view
  end

  -- The references subscriptions `subs` hold on a message they all take (lifecycle.lua ref_weight).
  function topic.refs_of(subs)
    local refs, weight = 0, lifecycle.ref_weight
    for i = 1, #subs do refs = refs + weight(subs[i].key) end
    return refs
  end

  -- Store a message once with references `refs` (topic.refs_of; memory counted on the topic, flow.lua).
  function topic.store(id, blob, refs, seq)
    local own_meta = base.K_META
    base.K_META = base.TP .. ':meta'
    flow.memory_charge(#blob)
    base.K_META = own_meta
    redis.call('HSET', base.TP .. ':msgs', id, blob)
    -- (as an integer's digits: Redis 7.0 writes a Lua number of 10^17 or more, 2^32 times 23 million
    -- durable subscriptions, in exponent notation, which HINCRBY refuses)
    redis.call('HSET', base.TP .. ':refs', id, string.format('%d', refs))
    redis.call('ZADD', base.TP .. ':order', seq, id)
  end

  -- Put a stored message in the current subscription's pending list. (A delayed message never gets
  -- here before its time: the topic keeps it as a job and publishes it when due, topic_send.lua.)
  function topic.add_to_current(id, m, seq_field)
    local seq = base.meta_incr(seq_field or 'seq')
    message.pending_add(id, message.pending_score(seq, m[message.PRIORITY]))
    base.meta_incr('enqueued')
  end

  -- The same for a send's messages in order, with one call per kind of write (a fan-out to many
  -- subscriptions does this once per subscription).
  function topic.add_all_to_current(ids, msgs)
    local last = redis.call('HINCRBY', base.K_META, 'seq', #ids)
    redis.call('HINCRBY', base.K_META, 'enqueued', #ids)
    local zadd, lowest = {}, nil
    for i, id in ipairs(ids) do
      local m = msgs[i]
      local score = message.pending_score(last - #ids + i, m[message.PRIORITY])
      zadd[#zadd + 1] = score
      zadd[#zadd + 1] = id
      if lowest == nil or score < lowest then lowest = score end
    end
    if #zadd > 0 then
      for from = 1, #zadd, 2000 do  -- unpack() has a limit; a large batch goes in slices
        redis.call('ZADD', base.K_PENDING, unpack(zadd, from, math.min(from + 1999, #zadd)))
      end
      -- As pending_add: one placed behind the pass cursor needs a restarted pass.
      local cursor = redis.call('HGET', base.K_META, 'cursor')
      if cursor and cursor ~= '' and lowest <= tonumber(cursor) then message.mark_dirty() end
    end
  end

  -- Does the current subscription hold message `id` already (pending, parked or in flight: with a
  -- consumer, or held for the transaction that acknowledged it, includes/lifecycle.lua txheld_key)?
  function topic.holds(id)
    return redis.call('ZSCORE', base.K_PENDING, id) or redis.call('ZSCORE', base.K_PARKED, id)
        or redis.call('HEXISTS', base.K_INFLIGHT, id) == 1 or redis.call('ZSCORE', base.P .. ':txheld', id)
  end

  -- §7.5: what the recovery policy keeps. Called on the topic prefix for every message sent. What it keeps
  -- counts in the topic's memory usage (flow.lua) like a stored message, until it is let go.
  function topic.recovery_add(id, blob, seq, retain)
    local pol = topic.policy()
    if retain == 'set' or retain == 'clear' then
      flow.memory_release(redis.call('HSTRLEN', base.TP .. ':retain', 'blob'))  -- 0 bytes when none was retained
    end
    if retain == 'set' then
      redis.call('HSET', base.TP .. ':retain', 'id', id, 'blob', blob)
      flow.memory_charge(#blob)
    elseif retain == 'clear' then
      redis.call('DEL', base.TP .. ':retain')
    end
    local kind = pol['subscriptionRecoveryPolicy']
    if kind == 'retainedMessage' or kind == 'none' then return end
    local K_RECOV, K_RMSG = base.TP .. ':recov', base.TP .. ':recovmsg'
    redis.call('ZADD', K_RECOV, seq, id)
    redis.call('HSET', K_RMSG, id, cmsgpack.pack({ blob, base.NOW }))
    flow.memory_charge(#blob)
    local function drop_first(n)
      if n <= 0 then return end
      local gone = redis.call('ZRANGE', K_RECOV, 0, n - 1)
      for _, old in ipairs(gone) do
        local rec = redis.call('HGET', K_RMSG, old)
        if rec then
          local bytes = #cmsgpack.unpack(rec)[1]
          redis.call('HINCRBY', base.TP .. ':meta', 'recov_bytes', -bytes)
          flow.memory_release(bytes)
        end
        redis.call('HDEL', K_RMSG, old)
        redis.call('ZREM', K_RECOV, old)
      end
    end
    redis.call('HINCRBY', base.TP .. ':meta', 'recov_bytes', #blob)
    local max = tonumber(pol['subscriptionRecoveryMaximumSize']) or -1
    if kind == 'lastImage' then
      drop_first(redis.call('ZCARD', K_RECOV) - 1)
    elseif kind == 'fixedCount' then
      if max < 1 then max = 100 end
      local over = redis.call('ZCARD', K_RECOV) - max
      if over > 0 then drop_first(over) end
    elseif kind == 'fixedSized' then
      if max < 1 then max = 65536 end
      while redis.call('ZCARD', K_RECOV) > 0 and tonumber(redis.call('HGET', base.TP .. ':meta', 'recov_bytes')) > max do
        drop_first(1)
      end
    elseif kind == 'timed' then
      topic.recovery_trim()
    end
  end

  -- TimedSubscriptionRecoveryPolicy: forget what is older than recoverDuration.
  function topic.recovery_trim()
    if topic.policy()['subscriptionRecoveryPolicy'] ~= 'timed' then return end
    local horizon = base.NOW - (tonumber(topic.policy()['recoverDuration']) or 60000)
    local K_RECOV, K_RMSG = base.TP .. ':recov', base.TP .. ':recovmsg'
    while true do
      local first = redis.call('ZRANGE', K_RECOV, 0, 0)
      if #first == 0 then return end
      local rec = redis.call('HGET', K_RMSG, first[1])
      local entry = rec and cmsgpack.unpack(rec)
      if entry and entry[2] >= horizon then return end
      if entry then
        redis.call('HINCRBY', base.TP .. ':meta', 'recov_bytes', -#entry[1])
        flow.memory_release(#entry[1])
      end
      redis.call('HDEL', K_RMSG, first[1])
      redis.call('ZREM', K_RECOV, first[1])
    end
  end

  -- The topic is being deleted: what the recovery policy kept stops counting in memory usage (the keys
  -- themselves are deleted by topic_ops.delete).
  function topic.recovery_release_all()
    flow.memory_release(redis.call('HSTRLEN', base.TP .. ':retain', 'blob'))
    local cursor = '0'
    repeat
      local page = redis.call('HSCAN', base.TP .. ':recovmsg', cursor, 'COUNT', 1000)
      cursor = page[1]
      for i = 2, #page[2], 2 do flow.memory_release(#cmsgpack.unpack(page[2][i])[1]) end
    until cursor == '0'
    redis.call('DEL', base.TP .. ':retain', base.TP .. ':recov', base.TP .. ':recovmsg')
    redis.call('HSET', base.TP .. ':meta', 'recov_bytes', 0)
  end

  -- Replay (id, blob) pairs into the current subscription `s` (a retroactive subscriber, §7.5): expired
  -- ones, ones it does not match and ones it holds already are left out. Appends the ids it got to `into`
  -- (when given) and returns how many.
  -- A replayed message still stored for other subscriptions is shared with them (one more reference). The
  -- retained copy is another message than the published one (RetainedMessageSubscriptionRecoveryPolicy
  -- replays a copy carrying ActiveMQ.Retained=true): while the published one is stored under the same id, the
  -- copy is stored once under its own id '<id>#retained' ('#' is never in a producer's id, messages.py) with
  -- its own reference count, and shared by the retroactive subscribers that come while it lasts.
  -- `seq_field`: the meta field their pending sequence comes from (default 'seq'; topic.catch_up).
  function topic.replay(s, items, into, seq_field)
    local got = 0
    for _, item in ipairs(items) do
      local id, blob = item[1], item[2]
      local m = message.unpack(blob)
      local own = id .. '#retained'
      if not message.is_expired(m) and not topic.holds(id) and not topic.holds(own) and topic.matches(s, id, m, nil) then
        local key, shared = id, redis.call('HGET', base.K_MSGS, id)
        if redis.call('HEXISTS', base.K_MSGS, own) == 1 then
          key, shared = own, true
        elseif shared and shared ~= blob then
          key, shared = own, false
        end
        local weight = lifecycle.ref_weight(base.SUB)
        if shared then
          redis.call('HINCRBY', base.TP .. ':refs', key, weight)  -- still stored for others: shared, not copied
        else
          topic.store(key, blob, weight, tonumber(redis.call('HINCRBY', base.TP .. ':meta', 'seq', 1)))
        end
        topic.add_to_current(key, m, seq_field)
        base.emit('recover', 'msg', key)
        got = got + 1
        if into then into[#into + 1] = key end
      end
    end
    return got
  end

  -- The recovery policy's messages, oldest first: its buffer, then the retained message if not in it.
  -- `upto` (a returning durable subscription, topic_subscribe.lua): only the buffer's messages with a topic
  -- sequence <= upto, those it has not had; what it acknowledged is not delivered again (ActiveMQ's durable
  -- subscription keeps its cursor, whose audit drops such a duplicate).
  function topic.recovery_items(with_buffer, upto)
    local items, seen = {}, {}
    if with_buffer then
      topic.recovery_trim()
      local ids = upto and redis.call('ZRANGEBYSCORE', base.TP .. ':recov', '-inf', upto)
        or redis.call('ZRANGE', base.TP .. ':recov', 0, -1)
      for _, id in ipairs(ids) do
        local rec = redis.call('HGET', base.TP .. ':recovmsg', id)
        if rec then
          items[#items + 1] = { id, cmsgpack.unpack(rec)[1] }
          seen[id] = true
        end
      end
    end
    local retained = redis.call('HMGET', base.TP .. ':retain', 'id', 'blob')
    if retained[1] and not seen[retained[1]] then items[#items + 1] = { retained[1], retained[2] } end
    return items
  end

  -- A new durable subscription created retroactive gets every message that was stored for other durable
  -- subscriptions when it was made, in topic order (KahaDB's addAckLocationForRetroactiveSub, §7.5), then
  -- the recovery policy's messages. A message is stored for a durable subscription while its references
  -- reach DURABLE_REF (lifecycle.lua ref_weight): one read tells, however many subscriptions the topic has
  -- (the new one holds none of them yet: it had only what was sent after it was made). A topic may store any
  -- number, so the walk of <topic>:order goes in slices of at most `checks` stored messages a call, fewer
  -- when the call's selector work or bytes read reach a call's worth (at least one message a call):
  -- topic_subscribe.lua makes the first slice, topic_catchup.lua the rest (its subscriber's add_consumer,
  -- or the maintenance tick should that process die). Its state, in the subscription's meta while it lasts:
  --   catchup       the topic sequence (<topic>:order's score: one per message) of the last message examined,
  --                 '' before the first: the walk goes on after it whatever was removed meanwhile
  --   catchup_upto  the topic sequence when the subscription was made: what was sent later reached it then
  --   catchup_seq   the pending sequence (message.pending_score) its next replayed message takes: those up
  --                 to its own 'seq' are reserved for them when it is made, so the backlog comes before
  --                 what reached it meanwhile, as when it was replayed in one call
  --   catchup_got   how many messages the backlog gave it so far
  --   catchup_sub   while a message stored before the topic's references were weighted is being asked
  --                 about (catch_up_unweighted): '<made>|<key>', the subscription asked last ('' none yet)
  -- and the fence '-inf' (dispatch.lua: the pass reads nothing) keeps anything from being dispatched to it
  -- before the backlog is all in.
  topic.CATCHUP_FIELDS = { 'catchup', 'catchup_upto', 'catchup_seq', 'catchup_got', 'catchup_sub' }

  -- A topic made by an earlier version (its meta has no 'weighted_after': admin.init_destination writes 0)
  -- is marked here, at its first retroactive catch-up, with its sequence now: every message stored later
  -- is stored by this version, with weighted references.
  function topic.catch_up_begin()
    local seq = redis.call('HGET', base.TP .. ':meta', 'seq') or 0
    redis.call('HSETNX', base.TP .. ':meta', 'weighted_after', seq)
    local reserve = redis.call('ZCARD', base.TP .. ':order') + redis.call('ZCARD', base.TP .. ':recov') + 1
    redis.call('HSET', base.K_META, 'catchup', '', 'catchup_upto', seq, 'catchup_seq', 0, 'catchup_got', 0,
               'catchup_sub', '', 'seq', reserve, 'fence', '-inf')
  end

  -- Does durable subscription `key` hold message `id`: pending, parked, in flight, or held for a
  -- transaction that acknowledged it, its subscriber gone (lifecycle.lua txheld_key)?
  local function durable_holds(key, id)
    local prefix = base.TP .. ':s:' .. key
    return redis.call('ZSCORE', prefix .. ':pending', id) or redis.call('ZSCORE', prefix .. ':parked', id)
        or redis.call('HEXISTS', prefix .. ':inflight', id) == 1 or redis.call('ZSCORE', prefix .. ':txheld', id)
  end

  -- Give stored message `id` to the catching-up subscription `s`: the bytes read, and the messages it got
  -- (none when it is no longer stored).
  local function replay_stored(s, id)
    local blob = redis.call('HGET', base.K_MSGS, id)
    if not blob then return 0, 0 end
    return #blob, topic.replay(s, { { id, blob } }, nil, 'catchup_seq')
  end

  local SORDER_READ = 100  -- subscription keys read at a time by catch_up_unweighted

  -- Where the questions about a message go on in :sorder, from the cursor catch_up_unweighted left: after
  -- the subscription asked last while it is still that one (a key removed and made again is another
  -- subscription, at the end of :sorder: its 'made', topic_subscribe.lua, tells), else from the start.
  -- Returns the index and the key.
  local function asked_last()
    local made, key = string.match(redis.call('HGET', base.K_META, 'catchup_sub') or '', '^([^|]*)|(.*)$')
    if not key then return 0, '' end
    local at = redis.call('LPOS', base.TP .. ':sorder', key)
    if not at or (redis.call('HGET', base.TP .. ':s:' .. key .. ':meta', 'made') or '') ~= made then return 0, '' end
    return at + 1, key
  end

  -- Record where the questions about the message after the cursor stopped: after subscription `key`.
  local function ask_next_after(key)
    local made = key ~= '' and (redis.call('HGET', base.TP .. ':s:' .. key .. ':meta', 'made') or '') .. '|' or ''
    redis.call('HSET', base.K_META, 'catchup_sub', made .. key)
  end

  -- A slice of the catch-up's walk over the messages stored up to `upto`, the topic's 'weighted_after': a
  -- message stored by an earlier version counts each holder's reference 1, a durable subscription's too,
  -- so its count cannot say whether one holds it (but 2^32 or more still says so: a reference this version
  -- added). The durable subscriptions are asked, in :sorder's order (which only grows at its end), each
  -- about its pending, parked, in-flight and transaction keys: at most `checks` questions and reads of
  -- SORDER_READ keys a call, one message being asked about over several calls when the topic has more
  -- durable subscriptions than that ('catchup_sub' says where it goes on; the subscription named there
  -- removed meanwhile, the message's questions start over: each is a read, asked_last). One made meanwhile
  -- is asked too, at the end of :sorder (it holds a stored message only through its own catch-up or a
  -- replay, by a weighted reference). `after`: the walk's cursor (catch_up). Returns whether this part is
  -- done, the cursor, and the messages it replayed.
  function topic.catch_up_unweighted(s, after, upto, checks)
    local K_SORDER = base.TP .. ':sorder'
    local index, last = asked_last()
    local spent, got, bytes = 0, 0, 0
    local moved = false  -- (a call asks one question at least, so the walk goes on whatever the budget)
    while true do
      local page = redis.call('ZRANGEBYSCORE', base.TP .. ':order', after == '' and '-inf' or '(' .. after, upto,
                              'WITHSCORES', 'LIMIT', 0, 1)
      if #page == 0 then
        ask_next_after('')
        return true, upto, got
      end
      local id = page[1]
      spent = spent + 1
      local held = (tonumber(redis.call('HGET', base.TP .. ':refs', id)) or 0) >= lifecycle.DURABLE_REF
      while not held do
        if spent >= checks and moved then
          ask_next_after(last)
          return false, after, got
        end
        local keys = redis.call('LRANGE', K_SORDER, index, index + SORDER_READ - 1)
        spent = spent + 1
        if #keys == 0 then break end  -- every durable subscription asked: none holds it
        for i = 1, #keys do
          local key = keys[i]
          if string.byte(key) == 100 and key ~= s.key then  -- a durable subscription's (lifecycle.ref_weight)
            if spent >= checks and moved then break end
            spent, moved = spent + 1, true
            held = durable_holds(key, id)
          end
          index, last = index + 1, key
          if held then break end
        end
      end
      if held then
        local read, n = replay_stored(s, id)
        bytes, got = bytes + read, got + n
      end
      after, index, last, moved = page[2], 0, '', true
      if spent >= checks or forward.work_spent() or bytes >= outbox.CALL_MOST_BYTES then
        ask_next_after('')
        return false, after, got
      end
    end
  end

  -- One slice of the current subscription `s`'s catch-up. Returns whether it is done, and how many messages
  -- it got in this call. The slice that finishes the backlog then replays the recovery policy's messages
  -- sent before the subscription was made (the buffer only if the backlog gave it nothing: its rule "only
  -- if that left nothing pending", DurableTopicSubscription.activate), the retained message always, and
  -- lifts the fence. Nothing under way: done.
  -- While subscriptions that ended still have messages to release (lifecycle.lua remove_subscription), a
  -- slice releases a chunk of them instead (as return_owed does): an ended durable subscription's references
  -- still count until then, and it holds nothing any more.
  function topic.catch_up(s, checks)
    local state = redis.call('HMGET', base.K_META, 'catchup', 'catchup_upto')
    if not state[1] then return true, 0 end
    local after, upto = state[1], tonumber(state[2])
    local got, done = 0, true
    local unweighted = math.min(tonumber(redis.call('HGET', base.TP .. ':meta', 'weighted_after')) or 0, upto)
    if redis.call('SCARD', base.TP .. ':ended') > 0 then
      lifecycle.release_ended(checks)
      done = false
    elseif unweighted > 0 and (after == '' or tonumber(after) < unweighted) then
      local finished
      finished, after, got = topic.catch_up_unweighted(s, after, unweighted, checks)
      done = finished and unweighted >= upto
    else
      local page = redis.call('ZRANGEBYSCORE', base.TP .. ':order', after == '' and '-inf' or '(' .. after, upto,
                              'WITHSCORES', 'LIMIT', 0, checks)
      done = #page < 2 * checks
      local ids = {}
      for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
      local refs = base.call_many('HMGET', base.TP .. ':refs', ids)
      local bytes = 0
      for i = 1, #page, 2 do
        if i > 1 and (forward.work_spent() or bytes >= outbox.CALL_MOST_BYTES) then
          done = false
          break
        end
        local id = page[i]
        after = page[i + 1]
        if (tonumber(refs[(i + 1) / 2]) or 0) >= lifecycle.DURABLE_REF then
          local read, n = replay_stored(s, id)
          bytes, got = bytes + read, got + n
        end
      end
    end
    if not done then
      redis.call('HSET', base.K_META, 'catchup', after)
      redis.call('HINCRBY', base.K_META, 'catchup_got', got)
      base.due_at(base.P, base.NOW + lifecycle.RETURNS_GRACE_MS)  -- the tick finishes it if its driver dies
      return false, got
    end
    local empty = got + tonumber(redis.call('HGET', base.K_META, 'catchup_got')) == 0
    got = got + topic.replay(s, topic.recovery_items(empty, upto), nil, 'catchup_seq')
    if empty then redis.call('HSET', base.K_META, 'replay_upto', -1) end
    redis.call('HDEL', base.K_META, 'fence', unpack(topic.CATCHUP_FIELDS))
    message.reset_pass()
    return true, got
  end

  -- §8.5: the current (non-durable) subscription `s`'s pending-message limit, from the policy's strategy;
  -- the consumer's own maximumPendingMessageLimit wins when > 0 and smaller (PolicyEntry.configure).
  function topic.pending_limit(prefetch, s)
    local pol = topic.policy()
    local strategy = pol['pendingMessageLimitStrategy']
    local value = -1
    if strategy == 'constant' then
      value = tonumber(pol['pendingMessageLimit']) or -1
    elseif strategy == 'prefetchRate' then
      value = math.floor(prefetch * (tonumber(pol['pendingMessageLimitMultiplier']) or 0.5))
    else
      return -1
    end
    local own = s and tonumber(s.def.maxpending) or 0
    if own > 0 and (value < 0 or own < value) then value = own end
    return value
  end

  -- Take message `id` out of the current subscription's pending list for good: evicted (lifecycle.lua
  -- discard_pending: ActiveMQ's discard, §8.5; `detail` the strategy) or dropped by a limit of 0.
  function topic.discard_pending(id, cause, detail)
    if cause == 'evicted' then
      return lifecycle.discard_pending(id, redis.call('HGET', base.K_MSGS, id), detail)
    end
    redis.call('ZREM', base.K_PENDING, id)
    message.pass_dirty.pending = nil  -- (message.lua)
    base.meta_incr('dropped')
    base.emit('drop', 'msg', id, 'cause', cause)
    lifecycle.drop_message(id)
  end

  -- Which pending messages the eviction strategy gives up (§8.5), from a page of the oldest.
  function topic.evict_choice(page_size)
    local pol = topic.policy()
    local strategy = pol['messageEvictionStrategy']
    local page = redis.call('ZRANGE', base.K_PENDING, 0, page_size - 1)
    if #page == 0 then return {} end
    if strategy == 'oldestMessageWithLowestPriority' then
      local lowest, pick = nil, nil
      for _, id in ipairs(page) do
        local blob = redis.call('HGET', base.K_MSGS, id)
        local p = blob and (tonumber(message.unpack(blob)[message.PRIORITY]) or 4) or 4
        if lowest == nil or p < lowest then lowest, pick = p, id end
      end
      return { pick }
    elseif strategy == 'uniquePropertyMessage' then
      -- UniquePropertyMessageEvictionStrategy: the newest message per property value stays; every other
      -- message of the page goes. With no message carrying the property, or nothing else to evict, the
      -- oldest goes.
      local name = pol['evictionPropertyName']
      local pivots, pivot_ts, order = {}, {}, {}
      for _, id in ipairs(page) do
        local blob = redis.call('HGET', base.K_MSGS, id)
        if blob then
          local m = message.unpack(blob)
          local flat = m[message.PROPS]
          if type(flat) == 'table' then
            for i = 1, #flat, 3 do
              if flat[i] == name then
                local value = flat[i + 1] .. ':' .. tostring(flat[i + 2])
                local ts = tonumber(m[message.TIMESTAMP]) or 0
                if pivots[value] == nil then order[#order + 1] = value end
                if pivots[value] == nil or ts > pivot_ts[value] then pivots[value], pivot_ts[value] = id, ts end
              end
            end
          end
        end
      end
      if #order > 0 then
        local keep = {}
        for _, value in ipairs(order) do keep[pivots[value]] = true end
        local out = {}
        for _, id in ipairs(page) do if not keep[id] then out[#out + 1] = id end end
        if #out > 0 then return out end
      end
    end
    return { page[1] }
  end

  -- The subscriptions a send (or a fan-out call) gave messages to, `touched[key] = {ids, msgs, s}` in the
  -- order `order`, take them and run a dispatch chunk each; non-durable ones then apply after_send. Returns
  -- dispatched, flags (1: a pass has more), the earliest hold_until, the keys whose pass has more.
  function topic.deliver(touched, order, budget)
    local dispatched, hold, more_keys = 0, 0, {}
    for _, key in ipairs(order) do
      local entry = touched[key]
      topic.switch(key)
      topic.add_all_to_current(entry.ids, entry.msgs)
      local d, more, h = dispatch.chunk(budget)
      dispatched = dispatched + d
      if more == 1 then more_keys[#more_keys + 1] = key end
      if h > 0 and (hold == 0 or h < hold) then hold = h end
      if not entry.s.def.durable then topic.after_send(entry.ids, entry.s) end
    end
    topic.switch(nil)
    return dispatched, #more_keys > 0 and 1 or 0, hold, more_keys
  end

  -- After a send reached the current non-durable subscription `s` (its new ids in `new_ids`): the topic
  -- slow rule (§8.1) and the pending-message limit with eviction (§8.5).
  function topic.after_send(new_ids, s)
    local cons = consumers.load()
    local c = cons[1]
    if not c then return end
    local waiting = redis.call('ZCARD', base.K_PENDING)
    local still_new = {}
    for _, id in ipairs(new_ids) do
      if redis.call('ZSCORE', base.K_PENDING, id) then still_new[#still_new + 1] = id end
    end
    -- §8.1 topic rule (TopicSubscription.add): slow when more than its prefetch were already waiting as a
    -- message arrived, so the last new one still pending does not count; an immediate dispatch clears it.
    if c.prefetch > 1 and #still_new > 0 and waiting - 1 > c.prefetch then
      if not c.slow then
        redis.call('HSET', base.K_C(c.id), 'slow_since', base.NOW)
        base.emit('slow', 'consumer', c.id)
      end
    elseif #still_new == 0 and c.slow then
      redis.call('HDEL', base.K_C(c.id), 'slow_since')
    end
    local limit = topic.pending_limit(c.prefetch, s)
    if limit == 0 then
      for _, id in ipairs(still_new) do topic.discard_pending(id, 'pending_limit') end
      return
    end
    if limit < 0 or waiting <= limit then return end
    local pol = topic.policy()
    local high = tonumber(pol['evictExpiredMessagesHighWatermark']) or 1000
    if limit < high then high = limit end
    if waiting > high then
      -- The first expired message found goes (removeExpiredMessages).
      for _, id in ipairs(redis.call('ZRANGE', base.K_PENDING, 0, 999)) do
        local blob = redis.call('HGET', base.K_MSGS, id)
        local m = blob and message.unpack(blob)
        if m and message.is_expired(m) then
          lifecycle.expire_pending(id, m, blob)
          break
        end
      end
    end
    local strategy = pol['messageEvictionStrategy']
    while true do
      local excess = redis.call('ZCARD', base.K_PENDING) - limit
      if excess <= 0 then break end
      local chosen = topic.evict_choice(math.max(1000, excess))
      if #chosen == 0 then break end
      for _, id in ipairs(chosen) do topic.discard_pending(id, 'evicted', strategy) end
    end
  end
end)
-- <ns>:durables: durable registry field (topics.durable_registry_field) -> the topic uri its subscription
-- is on. Like flow.lua's flow.usage, a broker-wide key outside the topic's hash tag: it is only ever changed
-- in the same script that creates or removes the subscription it names.
-- The registry's name is made once per prefix (as flow.lua's flow.usage), not per call; the per-call
-- selectors table is replaced only when a call used it (an empty one is as good as a new one).
--@on-call
if topic.registry_of ~= base.P then topic.registry_of, topic.registry = base.P, string.match(base.P, '^(.-):{') .. ':durables' end
if next(topic.selectors) ~= nil then topic.selectors = {} end
topic._policy = nil
--@on-call-end
