-- Wildcard topic subscriptions (docs/broker_core.md "Wildcard subscriptions"). Included by advisory.lua,
-- inside base.lua, so every script that has base has it: advisories and remove_subscription (lifecycle.lua)
-- use it too. Its one top-level local is its module table, `wildcard` (the scripts' main chunks are close
-- to Lua's limit of 200 active locals).
--
-- A subscription on `topic://orders.>` is an ordinary subscription of the pseudo-topic named by the
-- pattern (its own hash tag `{t:orders.>}`). The broker-wide set <ns>:wildcards holds the patterns that
-- currently have subscriptions: topic_subscribe.lua adds one with its first subscription, remove_subscription
-- (lifecycle.lua) takes it out with its last, in the same step (into <ns>:wildcards:idle until
-- maintenance has delivered what waits there and removed the keys: wildcard.drop_idle). A send to a
-- concrete topic reads the set and, within a call's worth (wildcard.MAX_VISITS), the matching patterns'
-- subscriptions in the step that accepts the message, and records one forward per matching pattern some
-- subscription of takes it or not decided by then (operations.forward delivers it), as virtual-topic copies and advisories travel. Like <ns>:usage and <ns>:durables, the set is
-- a key outside the hash tag: atomic on one Redis server, not across a cluster's slots.
--
-- Functions, built on a script's first use of one (base.lua `lazy`), and one per-call state: `sliced`,
-- whether the call built a slice of the trie already (wildcard.index_ready: one a call, however many
-- times the call reads the registry, an advisory each).

local wildcard = base.lazy({ sliced = false }, function(wildcard)

  -- A name's segments (names have no empty segment: destinations.py refuses them).
  function wildcard.segments(name)
    local out = {}
    for s in string.gmatch(name, '[^.]+') do out[#out + 1] = s end
    return out
  end

  -- ActiveMQ's wildcard rules (DestinationFilter), the same as broker_core/destinations.py `matches`:
  -- segments split on '.', '*' is exactly one segment, a trailing '>' is the remaining segments including
  -- none (`orders.>` matches `orders`). A name without wildcards matches only itself.
  -- `have`, when given, is `name` split already (wildcard.segments), for matching many patterns.
  function wildcard.matches(pattern, name, have)
    if pattern == name then return true end
    have = have or wildcard.segments(name)
    -- most registered patterns differ from the name in their first segment: rejected before splitting
    local first = string.match(pattern, '^[^.]+')
    if first ~= '*' and first ~= '>' and first ~= have[1] then return false end
    local want = wildcard.segments(pattern)
    local fixed = #want
    if want[fixed] == '>' then
      fixed = fixed - 1
      if #have < fixed then return false end
    elseif #have ~= fixed then
      return false
    end
    for i = 1, fixed do
      if want[i] ~= '*' and want[i] ~= have[i] then return false end
    end
    return true
  end

  -- Whether a concrete name is a temporary destination's (destinations.py TEMP_NAME, the same strict
  -- scheme: `ID:<ws|tcp|ssl>-<16 lower-case hex digits>:<1 to 9 digits, no leading 0>`).
  function wildcard.is_temporary(name)
    local transport, hex, number = string.match(name, '^ID:(%l+)%-([0-9a-f]+):([1-9]%d*)$')
    return transport ~= nil and (transport == 'ws' or transport == 'tcp' or transport == 'ssl')
      and #hex == 16 and #number <= 9
  end

  -- Whether a name is a pattern. Concrete names never contain '*' or '>' (destinations.py refuses them
  -- unless they are whole wildcard segments of a pattern).
  function wildcard.is_pattern(name)
    return string.find(name, '[*>]') ~= nil
  end

  function wildcard.registry(ns)
    return ns .. ':wildcards'
  end

  -- The registered patterns by segment, so that a send to a topic reads those that match it, not every
  -- one (10,000 registered patterns cost each send 8 ms read whole): a trie of hashes, the node of a pattern
  -- prefix `path` (its first segments joined by '.', '' for the root) being <ns>:wildcards:t:<path>, each
  -- field a segment that follows it, its value how many registered patterns go through it; field '' counts
  -- the pattern that ends there, field '>' the pattern `<path>.>` (a `>` is a pattern's last segment:
  -- destinations.py refuses it elsewhere, and a pattern with one elsewhere is not indexed, matching no
  -- name). Kept with <ns>:wildcards (wildcard.mark) from a namespace's first pattern on: <ns>:wildcards:indexed
  -- says so. A namespace whose patterns were registered before it gets it built in slices, by the calls
  -- that read it (wildcard.index_ready: built in one call it took 80 ms at 10,000, about 7 µs a pattern).
  function wildcard.node(ns, path)
    return ns .. ':wildcards:t:' .. path
  end

  function wildcard.indexed(ns)
    return ns .. ':wildcards:indexed'
  end

  -- The registries this size or smaller are read whole (SMEMBERS, wildcard.matches each: about 0.8 µs a
  -- pattern), as the trie costs a read for each prefix of the matching patterns (2,000 patterns matching
  -- one name, with 4,000 prefixes, made the walk 24 ms where the whole set took 9).
  wildcard.SCAN_MOST = 2000

  -- Count pattern `name` in or out of the trie (`by`: 1 or -1), a node's field going at 0.
  function wildcard.index(ns, name, by)
    local segs, path = wildcard.segments(name), ''
    for i = 1, #segs - 1 do
      if segs[i] == '>' then return end  -- (matches no name: left out)
    end
    local function count(node_path, field)
      local node = wildcard.node(ns, node_path)
      if redis.call('HINCRBY', node, field, by) <= 0 then redis.call('HDEL', node, field) end
    end
    for i, seg in ipairs(segs) do
      count(path, seg)
      if seg == '>' then return end
      path = i == 1 and seg or path .. '.' .. seg
    end
    count(path, '')
  end

  -- While the trie is built: <ns>:wildcards:scan, the SSCAN cursor where the walk of the registry goes on.
  function wildcard.scan(ns)
    return ns .. ':wildcards:scan'
  end

  -- Is pattern `name` counted in the trie? Its last count tells: field '' of its own node, or field '>' of
  -- its prefix's for one ending in '>' (one pattern's alone). False for one the trie leaves out.
  function wildcard.counted(ns, name)
    local segs = wildcard.segments(name)
    for i = 1, #segs - 1 do
      if segs[i] == '>' then return false end
    end
    local last, field = #segs, ''
    if segs[last] == '>' then last, field = last - 1, '>' end
    return redis.call('HEXISTS', wildcard.node(ns, table.concat(segs, '.', 1, last)), field) == 1
  end

  -- What a call of the trie's build reads of the registry at most (SSCAN's COUNT: about that many
  -- patterns, 7 µs each to count in).
  wildcard.BUILD_SLICE = 250

  -- Is the trie complete? If not, a slice of its build is done here, one a call (the registry walked
  -- with SSCAN from where the last slice stopped, each pattern not counted yet counted in: a scan may
  -- return one twice): returns whether it is complete now. SSCAN returns every pattern registered from
  -- the walk's start to its end; one registered or gone meanwhile is counted in or out by wildcard.mark,
  -- as it is once the trie is complete.
  function wildcard.index_ready(ns)
    if redis.call('EXISTS', wildcard.indexed(ns)) == 1 then return true end
    if wildcard.sliced then return false end
    wildcard.sliced = true
    local page = redis.call('SSCAN', wildcard.registry(ns), redis.call('GET', wildcard.scan(ns)) or '0',
                            'COUNT', wildcard.BUILD_SLICE)
    for _, name in ipairs(page[2]) do
      if not wildcard.counted(ns, name) then wildcard.index(ns, name, 1) end
    end
    if page[1] ~= '0' then
      redis.call('SET', wildcard.scan(ns), page[1])
      return false
    end
    redis.call('SET', wildcard.indexed(ns), '1')
    redis.call('DEL', wildcard.scan(ns))
    return true
  end

  -- What wildcard.matching gives while the trie is built: the patterns matching the name are not known
  -- yet. A send's fan-out lists it as a pattern to decide ('w.', no pattern being empty), and lists the
  -- matching patterns in its place once the trie is complete (fanout.run).
  wildcard.UNBUILT = ''

  -- The registered patterns that match a name of segments `have`, from the trie: walked from the root along
  -- the name's segment and `*` at each depth, a `>` there a match (the rest, one segment or more), the
  -- pattern ending at the last depth one, and one ending in `>` past it (none left). Each node read is a
  -- prefix of a registered pattern that matches the name so far.
  function wildcard.walk(ns, have)
    local out, frontier = {}, { '' }
    local function join(path, seg) return path == '' and seg or path .. '.' .. seg end
    for i = 1, #have do
      local next_frontier = {}
      for _, path in ipairs(frontier) do
        local c = redis.call('HMGET', wildcard.node(ns, path), have[i], '*', '>')
        if c[1] then next_frontier[#next_frontier + 1] = join(path, have[i]) end
        if c[2] then next_frontier[#next_frontier + 1] = join(path, '*') end
        if c[3] then out[#out + 1] = join(path, '>') end
      end
      frontier = next_frontier
    end
    for _, path in ipairs(frontier) do
      local c = redis.call('HMGET', wildcard.node(ns, path), '', '>')
      if c[1] then out[#out + 1] = path end
      if c[2] then out[#out + 1] = join(path, '>') end
    end
    return out
  end

  -- The current topic's namespace and name, from its prefix `<ns>:{t:<name>}`; nil for a queue.
  function wildcard.topic_name()
    local ns, name = string.match(base.TP, '^(.-):{t:(.*)}$')
    return ns, name
  end

  -- <ns>:wildcards:idle: the patterns whose last subscription went while their pseudo-topic still has keys
  -- (its counters, policy, and above all forwards not yet delivered: a wildcard subscription's dead letter
  -- is recorded in the pseudo-topic's forwarding hash). Nothing lists a pseudo-topic otherwise, so
  -- maintenance.run_due visits these too: it delivers the forwards, then wildcard.drop_idle removes the keys.
  function wildcard.idle(ns)
    return ns .. ':wildcards:idle'
  end

  -- The current topic, when it is a pattern, just got a subscription (`active`: registered, idempotent, so
  -- sends copy to it) or lost its last one, durable ones included (sends stop copying to it, and its
  -- pseudo-topic waits in <ns>:wildcards:idle for maintenance).
  function wildcard.mark(active)
    local ns, name = wildcard.topic_name()
    if not (name and wildcard.is_pattern(name)) then return end
    local into, out_of = wildcard.registry(ns), wildcard.idle(ns)
    if not active then into, out_of = out_of, into end
    local added, removed = redis.call('SADD', into, name), redis.call('SREM', out_of, name)
    -- (the registry's trie, once built: a pattern counted once while registered; begun with a namespace's
    -- first pattern, so only a namespace whose patterns were registered before it has one to build; while
    -- it is built, wildcard.index_ready, a pattern counted in by the build's walk or not yet)
    local indexed = redis.call('EXISTS', wildcard.indexed(ns)) == 1
    if not indexed and active and added == 1 and redis.call('SCARD', into) == 1 then
      redis.call('SET', wildcard.indexed(ns), '1')
      redis.call('DEL', wildcard.scan(ns))  -- (a build under way: every pattern it counted is gone)
      indexed = true
    end
    if indexed then
      if active and added == 1 then wildcard.index(ns, name, 1) end
      if not active and removed == 1 then wildcard.index(ns, name, -1) end
    elseif redis.call('EXISTS', wildcard.scan(ns)) == 1 then
      local counted = wildcard.counted(ns, name)
      if active and added == 1 and not counted then wildcard.index(ns, name, 1) end
      if not active and removed == 1 and counted then wildcard.index(ns, name, -1) end
    end
  end

  -- The current topic's keys, a pattern's pseudo-topic in <ns>:wildcards:idle, removed in this step once
  -- nothing is left to do there: no subscription (one made since took it out of the set: it stays), no
  -- forward waiting, no maintenance job holding a lease on it (`leases`: lease key names, the jobs'). Returns
  -- 1 when the keys went (or there were none), 0 when it must wait (maintenance tries again next tick).
  function wildcard.drop_idle(leases)
    local ns, name = wildcard.topic_name()
    if not name or not wildcard.is_pattern(name) then return 0 end
    if redis.call('HLEN', base.TP .. ':subs') > 0 or redis.call('SISMEMBER', wildcard.registry(ns), name) == 1 then
      redis.call('SREM', wildcard.idle(ns), name)  -- subscribed again: not idle
      return 0
    end
    if redis.call('HLEN', base.TP .. ':fwd') > 0 then return 0 end
    -- (an ended subscription's messages still to release: maintenance's recovery releases them first)
    if redis.call('SCARD', base.TP .. ':ended') > 0 then return 0 end
    -- (a fan-out of its own still unfinished: maintenance's recovery finishes it first, fanout.lua)
    if redis.call('LLEN', base.TP .. ':fanout') > 0 then return 0 end
    for _, job in ipairs(leases) do
      if redis.call('EXISTS', base.TP .. ':lease:' .. job) == 1 then return 0 end
    end
    -- what it still holds (nothing, normally: the subscriptions' messages went with them) stops counting
    -- towards the broker's memory usage, as destination_delete.lua does (flow.lua's flow.usage, included
    -- after this file)
    local mem = tonumber(redis.call('HGET', base.TP .. ':meta', 'mem')) or 0
    if mem ~= 0 then redis.call('HINCRBY', ns .. ':usage', 'used', 0 - mem) end
    local keys = {}
    for _, suffix in ipairs({ 'meta', 'policy', 'msgs', 'fwd', 'audit', 'events', 'maint', 'slowcons',
                              'aborted', 'aborted:at', 'memres', 'subs', 'sorder', 'sprio', 'sprio:build', 'subof',
                              'refs', 'order', 'retain', 'recov', 'recovmsg', 'fanout', 'fanout:n', 'fanout:at' }) do
      keys[#keys + 1] = base.TP .. ':' .. suffix
    end
    redis.call('DEL', unpack(keys))
    redis.call('SREM', wildcard.idle(ns), name)
    return 1
  end

  -- The registered patterns that match topic `name` of namespace `ns` (none for a pattern itself: a copy
  -- delivered to a pattern's pseudo-topic is not matched again; none for a temporary topic: ActiveMQ
  -- matches wildcards within one destination type, and a temporary topic is a type of its own, so nobody
  -- else's `>` reads the replies sent to it). Read on every call, never cached, so a subscription made by
  -- any process counts from the moment its subscribe returned. While the trie of a registry past
  -- SCAN_MOST is built (wildcard.index_ready, a slice of it done here), nil: not known yet.
  function wildcard.matching(ns, name)
    local out = {}
    if wildcard.is_pattern(name) or (string.sub(name, 1, 3) == 'ID:' and wildcard.is_temporary(name)) then
      return out
    end
    local registry = wildcard.registry(ns)
    local registered = redis.call('SCARD', registry)
    if registered == 0 then return out end  -- (most topics' sends: no pattern subscribed to anywhere)
    local have = wildcard.segments(name)
    if registered <= wildcard.SCAN_MOST then
      for _, pattern in ipairs(redis.call('SMEMBERS', registry)) do
        if wildcard.matches(pattern, name, have) then out[#out + 1] = pattern end
      end
    else
      if not wildcard.index_ready(ns) then return nil end
      out = wildcard.walk(ns, have)
    end
    table.sort(out)  -- SMEMBERS has no order; forwards are recorded in a stable one
    return out
  end

  -- What a send's call spends on the matching patterns' subscriptions at most, in visits: a definition read
  -- and decoded is one, a subscription tried against a message one more. A pattern undecided when they are
  -- spent gets its copy, as one undecided when the call's selector work is (wildcard.takers): a pattern's
  -- subscriptions are not limited in number (one with 10,000 made every send to a matching topic read and
  -- try them all in its call: 64 ms of CPU). Definitions are read SLICE at a time, as they are needed.
  wildcard.MAX_VISITS = 2000
  wildcard.SLICE = 64

  -- The `k`th subscription of pattern `pattern`'s pseudo-topic (namespace found.ns), as topic.subscriptions
  -- reads the current topic's, its key prefixed with the pattern (topic.matches caches a selector per key,
  -- and the topic's own subscriptions may use the same keys). found.subs[pattern] keeps those read so far in
  -- the call, in :sorder's order (`at`: the keys of :sorder read; `done`: all of them), the next slice read
  -- when needed while the call has visits left. Returns the subscription; else nil and whether the pattern
  -- is known to have no more (false: the visits are spent). Keys under the pattern's hash tag: like
  -- <ns>:wildcards, read in the send's step, atomic on one Redis server only.
  function wildcard.subscription(found, pattern, k)
    local read = found.subs[pattern]
    if not read then
      read = { at = 0, done = false }
      found.subs[pattern] = read
    end
    while not read[k] do
      if read.done then return nil, true end
      local room = wildcard.MAX_VISITS - found.visits
      if room <= 0 then return nil, false end
      local tp = found.ns .. ':{t:' .. pattern .. '}'
      local want = math.min(wildcard.SLICE, room)
      local keys = redis.call('LRANGE', tp .. ':sorder', read.at, read.at + want - 1)
      read.at, read.done = read.at + #keys, #keys < want
      if #keys > 0 then
        found.visits = found.visits + #keys
        local defs = redis.call('HMGET', tp .. ':subs', unpack(keys))
        for i = 1, #keys do  -- (a key without its definition, a subscription going, is left out)
          if defs[i] then read[#read + 1] = { key = pattern .. '|' .. keys[i], def = cmsgpack.unpack(defs[i]) } end
        end
      end
    end
    return read[k]
  end

  -- What a call decides about patterns at most (wildcard.takers): each costs reading its first definitions
  -- and trying them, and the copy it is owed (a forward record and its event); 2,000 patterns matching one
  -- topic made one send of 38 ms of CPU. The patterns past it are left to the fan-out's calls (fanout.lua).
  wildcard.MAX_PATTERNS = 200

  -- What a call reads of wildcard subscriptions, for the current topic (a concrete one): its namespace,
  -- its uri (the destination the copies' consumers see), the patterns' subscriptions read so far
  -- (wildcard.subscription), the visits spent and the patterns decided (wildcard.takers).
  function wildcard.reader()
    local ns, name = wildcard.topic_name()
    return { ns = ns, uri = 'topic://' .. name, subs = {}, visits = 0, decided = 0 }
  end

  -- What a topic send needs: wildcard.reader with the patterns matching this topic (their subscriptions
  -- read as the send tries them; { UNBUILT } and `unbuilt` while the trie is built: decided by the
  -- fan-out once it is), and whether the topic is itself a pattern (its pseudo-topic keeps no recovery
  -- buffer).
  function wildcard.for_send()
    local found = wildcard.reader()
    local _, name = wildcard.topic_name()
    found.patterns, found.is_pattern = wildcard.matching(found.ns, name), wildcard.is_pattern(name)
    if not found.patterns then found.patterns, found.unbuilt = { wildcard.UNBUILT }, true end
    return found
  end

  -- The patterns among `patterns` that some subscription of takes message (id, m): noLocal and the
  -- selector, as for the topic's own subscriptions (Topic.dispatch offers a message to every consumer,
  -- wildcard ones included). Only those get a copy, so a message every subscription refuses is the topic's
  -- `no_subscription` and NoConsumer advisory (topic_send.lua, fanout.finish), as in ActiveMQ. `found`:
  -- wildcard.reader's; `matches` is topic.matches (includes/topic.lua, included after this file, so passed
  -- in). Once the call's selector work is spent (`spent`: forward.work_spent) or its visits
  -- (wildcard.MAX_VISITS), a pattern not decided yet gets its copy unchecked: its pseudo-topic matches its
  -- subscriptions itself, in slices (fanout.lua), and counts the copy `no_subscription` if none takes it.
  -- Returns the patterns, the selector view (reused for the next subscription), and those `patterns` left
  -- undecided once the call has decided MAX_PATTERNS (nil when none is).
  function wildcard.takers(found, patterns, id, m, view, matches, spent)
    local out = {}
    for p, pattern in ipairs(patterns) do
      if found.decided >= wildcard.MAX_PATTERNS then
        local left = {}
        for q = p, #patterns do left[#left + 1] = patterns[q] end
        return out, view, left
      end
      found.decided = found.decided + 1
      local k = 1
      while true do
        local s, known
        if not spent() and found.visits < wildcard.MAX_VISITS then s, known = wildcard.subscription(found, pattern, k) end
        if not s then
          if not known then out[#out + 1] = pattern end  -- undecided: the copy decides there
          break
        end
        local ok
        found.visits = found.visits + 1
        ok, view = matches(s, id, m, view)
        if ok then
          out[#out + 1] = pattern
          break
        end
        k = k + 1
      end
    end
    return out, view, nil
  end

  -- Record the copy of message `id` that each pattern in `patterns` is owed, in the current topic's
  -- forwarding hash, in the calling (send) step. The record carries the topic's uri, which the copy
  -- keeps as the destination its consumers see (operations.forward, topics.wildcard_copy).
  function wildcard.record(id, blob, uri, patterns)
    for _, pattern in ipairs(patterns) do
      local target = 'topic://' .. pattern
      redis.call('HSET', base.TP .. ':fwd', id .. '|' .. target,
                 cmsgpack.pack({ target, 'wildcard', uri, blob, redis.call('HINCRBY', base.TP .. ':meta', 'fwdseq', 1) }))
      base.due_at(base.TP, base.NOW)
    end
  end
end)
--@on-call
wildcard.sliced = false
--@on-call-end
