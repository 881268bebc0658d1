-- Shared helpers. Every script receives KEYS[1] = the destination's key prefix, e.g. "sb:{q:orders}".
-- All other keys of the destination are derived from it and so share its hash tag (one cluster slot).
-- Topics (docs/broker_core.md "Topics"): a subscription is run by the same scripts as a queue, under its
-- own prefix "<topic prefix>:s:<subscription key>" inside the topic's hash tag. Its dispatch state is its
-- own; what the topic shares (the policy, the messages stored once, the event stream, forwards) lives
-- under the topic prefix TP. For a queue TP == P and SUB is nil. `base.use_prefix` switches a script between
-- subscriptions (a topic send fans out to several in one call).
-- Its module table is `base`: the current prefix's key names (base.P, base.K_META, ...: set by use_prefix
-- only, but for K_META, which two paths change for a moment), the call's time base.NOW (set by each script
-- from its ARGV before anything else runs), and the helpers every script uses. A function that reads a
-- field many times reads it into a local first: a module's field read costs more than a local's
-- (bench/redis_instructions.py).
local base = {
  P = false, TP = false, SUB = nil,
  K_META = false, K_POLICY = false, K_MSGS = false, K_PENDING = false, K_INFLIGHT = false, K_REDELIV = false,
  K_GFIRST = false, K_CONSUMERS = false, K_CORDER = false, K_LEASES = false, K_PASSFULL = false,
  K_GROUPS = false, K_GLRU = false, K_EVENTS = false, K_PARKED = false, K_PARKINFO = false, K_FWD = false,
  K_SCHED = false, K_AUDIT = false, K_TMETA = false,
  NOW = 0,
}
-- The key names of a prefix are built once and kept (per call with EVAL; where the library outlives a
-- call, across calls, bounded): every call starts here, and building 19 strings is not free.
-- A consumer's key names (base.K_C ...) likewise, kept with its prefix's (bounded too).
do
  -- kept only where the library outlives a call (with EVAL nothing outlives the call, and a call rarely
  -- switches prefixes); the same test as `lazy` below
  local keep = redis.register_function ~= nil
  local known = { n = 0, by_prefix = {} }
  local current = nil  -- the names of P
  local function names(prefix)  -- (one table constructor: sized once, never grown)
    local P = prefix
    local topic, sub = string.match(prefix, '^(.-}):s:(.+)$')
    local TP = topic or prefix
    return {
      P = P, TP = TP, SUB = topic and sub or nil, count = 0,
      c = keep and {} or nil, cinf = keep and {} or nil, cout = keep and {} or nil, cgrp = keep and {} or nil,
      K_META = P .. ':meta',          -- hash: counters, sequences, dispatch-pass state, exclusive owner
      K_POLICY = TP .. ':policy',     -- hash: the resolved policy entry (camelCase attribute names)
      K_MSGS = TP .. ':msgs',         -- hash: message id -> packed message (msgpack array, see message.lua)
      K_PENDING = P .. ':pending',    -- zset: message id -> dispatch order score
      K_INFLIGHT = P .. ':inflight',  -- hash: message id -> "<consumer>|<pending score>"
      K_REDELIV = P .. ':redeliv',    -- hash: message id -> redelivery counter (only when > 0)
      K_GFIRST = P .. ':gfirst',      -- set: ids flagged JMSXGroupFirstForConsumer
      K_CONSUMERS = P .. ':consumers',-- hash: consumer id -> packed consumer definition
      K_CORDER = P .. ':corder',      -- list: consumer ids in dispatch order (priority, rotation)
      K_LEASES = P .. ':leases',      -- zset: consumer id -> lease expiry (ms)
      K_PASSFULL = P .. ':passfull',  -- set: consumers found full during the current dispatch pass
      K_GROUPS = P .. ':groups',      -- hash: group id (or bucket) -> "<consumer>|<assigned ms>"
      K_GLRU = P .. ':glru',          -- zset: group id -> recency (cached map LRU; bucket map name cache)
      K_EVENTS = TP .. ':events',     -- stream: lifecycle events
      K_PARKED = P .. ':parked',      -- zset: message id -> time it becomes visible (redelivery delay, schedule)
      K_PARKINFO = P .. ':parkinfo',  -- hash: parked message id -> its pending score when it comes back
      K_FWD = TP .. ':fwd',           -- hash: message id -> packed forward (dead letter, move) to deliver
      K_SCHED = P .. ':sched',        -- hash: repeating scheduled message id -> packed job
      K_AUDIT = P .. ':audit',        -- zset: recently enqueued ids -> broker sequence (duplicate detection)
      K_TMETA = TP .. ':meta',        -- hash: TP's meta (a queue's is K_META's; a subscription's, its topic's)
    }
  end
  function base.use_prefix(prefix)
    -- Where the library outlives a call, the names are the fields' values still when the last call used
    -- the same prefix: only use_prefix sets them, but for K_META, which two paths change for a moment
    -- (lifecycle.lua release_shared, topic.lua), so it is compared too (a call that failed in between).
    local b = base
    if current ~= nil and b.P == prefix and current.P == prefix and b.K_META == current.K_META then return end
    local k = keep and known.by_prefix[prefix]
    if not k then
      k = names(prefix)
      if keep then
        if known.n >= 1024 then known.n, known.by_prefix = 0, {} end
        known.n = known.n + 1
        known.by_prefix[prefix] = k
      end
    end
    current = k
    b.P, b.TP, b.SUB = k.P, k.TP, k.SUB
    b.K_META, b.K_POLICY, b.K_MSGS, b.K_PENDING, b.K_INFLIGHT = k.K_META, k.K_POLICY, k.K_MSGS, k.K_PENDING,
                                                                k.K_INFLIGHT
    b.K_REDELIV, b.K_GFIRST, b.K_CONSUMERS, b.K_CORDER = k.K_REDELIV, k.K_GFIRST, k.K_CONSUMERS, k.K_CORDER
    b.K_LEASES, b.K_PASSFULL, b.K_GROUPS, b.K_GLRU, b.K_EVENTS = k.K_LEASES, k.K_PASSFULL, k.K_GROUPS, k.K_GLRU,
                                                               k.K_EVENTS
    b.K_PARKED, b.K_PARKINFO, b.K_FWD, b.K_SCHED, b.K_AUDIT = k.K_PARKED, k.K_PARKINFO, k.K_FWD, k.K_SCHED,
                                                            k.K_AUDIT
    b.K_TMETA = k.K_TMETA
  end
  local function remember(kind, cid, key)
    if current.count >= 1024 then
      current.count, current.c, current.cinf, current.cout, current.cgrp = 0, {}, {}, {}, {}
    end
    current.count = current.count + 1
    current[kind][cid] = key
    return key
  end
  local function consumer_key(kind, cid, suffix)
    if not keep then return base.P .. ':c:' .. cid .. suffix end
    return current[kind][cid] or remember(kind, cid, base.P .. ':c:' .. cid .. suffix)
  end
  function base.K_C(cid) return consumer_key('c', cid, '') end                -- hash: per-consumer counters
  function base.K_CINF(cid) return consumer_key('cinf', cid, ':inflight') end -- zset: id -> dispatch seq
  function base.K_COUT(cid) return consumer_key('cout', cid, ':outbox') end   -- list: dispatched, not yet received
  function base.K_CGRP(cid) return consumer_key('cgrp', cid, ':groups') end   -- set: groups this consumer owns
end

-- State that lives for one call. On Redis >= 7 these includes are loaded once as a function library
-- (broker_core/scripts/library.py), so their top-level statements run once, not per call: whatever a call
-- changes outside its own functions is reset here. Each include writes its resets between a line
-- `--@on-call` and a line `--@on-call-end`, next to the state they reset; scripts/library.py takes these
-- blocks out of their place and makes of them, in their order, the one function base.reset_call, put
-- after the includes (where every module table is in scope). One function, not one per include: a call
-- of a Lua function costs about as much as the statements of a reset, and every script call runs them
-- all (docs/benchmarks.md, "Session 26"). Every script starts with base.begin_call(KEYS)
-- (scripts/library.py puts it in front of the script's body).
base.reset_call = false  -- (made by scripts/library.py)
-- A call given a second key is a step of a transaction's commit (ops/transactions.py commit): KEYS[2] is
-- the transaction's key. Its commit is one MULTI/EXEC whose calls check every step first, then apply them;
-- Redis applies every command of a MULTI whatever the others replied, so the calls share a verdict: a
-- step runs only while the transaction is open and its refusal key is absent, writes that key as it
-- begins and deletes it as it ends unrefused (base.end_call). A step that refuses (an error reply), or
-- dies of a runtime error (a script error: it never reaches end_call), leaves the key, and no later step
-- runs. So either every step applies or none does; the commit's last call (commit_end.lua) ends the
-- transaction or, refused, deletes the key. (A step Redis refuses before it runs, a function without
-- allow-oom over maxmemory, cannot happen inside the commit: Redis then refuses the whole EXEC. An EVAL
-- script is refused at its first write instead: begin_call's first write cannot be.)
base.STEP_OF = false  -- (set by each call: begin_call)
function base.refusal_key(tx_key) return tx_key .. ':refused' end
function base.begin_call(keys)
  base.use_prefix(keys[1])
  base.reset_call()
  -- (a commit's step has its transaction's key, <ns>:tx:tx-<16 hex digits> (ops/transactions.py begin),
  -- second; a script over several destinations, summary_many, rate_sample, has their prefixes there,
  -- <ns>:{<tag>}..., which never end so. Not "has no {": a namespace may hold one, `{sb}`)
  local tx = keys[2]
  if tx and not string.find(tx, ':tx:tx%-%x+$') then tx = false end
  base.STEP_OF = tx
  if tx then
    local refusal = base.refusal_key(tx)
    if redis.call('EXISTS', tx) == 0 or redis.call('EXISTS', refusal) == 1 then
      base.STEP_OF = false  -- (not this step's refusal: end_call leaves the key as it is)
      return base.fail('NOT_APPLIED', 'a step of the commit of ' .. tx .. ' before this one was refused')
    end
    -- (an EVAL script's first write is refused over maxmemory unless it cannot grow memory, and those
    -- after it are let through, scripts/library.py: a DEL first, so the mark is always written. Redis is
    -- over it here only if it got over between the MULTI's queueing and its EXEC; the function form's EXEC
    -- is then refused whole)
    redis.call('DEL', refusal .. ':-')
    redis.call('SET', refusal, 'a step began and did not end')  -- (end_call deletes it, or names the error)
  end
end

-- A table of functions an include builds on first use. Redis runs an EVAL script's whole text on every
-- call, so each function an include defines is built again each time, used or not; `build(t)` runs when a
-- call first reads a field `t` lacks, and `t` is an ordinary table from then on. State fields set on `t`
-- are left alone. A function library (Redis >= 7) is built once, when loaded (where setmetatable is not
-- offered): there `build` runs at once.
function base.lazy(t, build)
  if redis.register_function then
    build(t)
    return t
  end
  return setmetatable(t, { __index = function(self, key)
    setmetatable(self, nil)
    build(self)
    return rawget(self, key)
  end })
end

function base.fail(code, text)
  return redis.error_reply(code .. ' ' .. text)
end

function base.tonum(v, default)
  if v == false or v == nil then return default end
  local n = tonumber(v)
  if n == nil then return default end
  return n
end

-- Policy values, read once per script call. Missing attributes fall back to ActiveMQ's defaults.
base.POLICY_NAMES = {
  'prioritizedMessages', 'strictOrderDispatch', 'useConsumerPriority', 'allConsumersExclusiveByDefault',
  'consumersBeforeDispatchStarts', 'timeBeforeDispatchStarts', 'messageGroupMapFactoryType',
  'groupMapCacheSize', 'groupMapBucketCount', 'maxPageSize', 'usePrefetchExtension', 'eventsMaxLen',
  'queuePrefetch', 'maxMessageSize', 'maxPropertyCount',
  'maximumRedeliveries', 'initialRedeliveryDelay', 'redeliveryDelay', 'useExponentialBackOff',
  'backOffMultiplier', 'maximumRedeliveryDelay', 'useCollisionAvoidance', 'deadLetterTarget',
  'processExpired', 'processNonPersistent', 'enableAudit', 'maxQueueAuditDepth', 'maxExpirePageSize',
  -- flow control (includes/flow.lua) and advisories (includes/advisory.lua)
  'producerFlowControl', 'memoryLimit', 'sendFailIfNoSpace', 'sendFailIfNoSpaceAfterTimeout',
  'advisoryForSlowConsumers', 'advisoryWhenFull', 'advisoryForDiscardingMessages', 'advisoryForDelivery',
  'advisoryForConsumed', 'advisoryForDispatched', 'advisoryForFastProducers', 'includeBodyForAdvisory',
  'sendAdvisoryIfNoConsumers',
}
base.POLICY_DEFAULTS = {
  '0', '0', '1', '0', '0', '0', 'cached', '1024', '1024', '200', '1', '100000', '1000', '1048576', '256',
  '6', '1000', '1000', '0', '5.0', '-1', '0', 'queue://ActiveMQ.DLQ', '1', '0', '1', '2048', '400',
  '1', '0', '-1', '-1', '0', '0', '0', '0', '0', '0', '0', '0', '0',
}
-- A policy hash's fields read with HMGET (false where unset) as a table by name, defaults filled in.
function base.with_defaults(names, defaults, values)
  local out = {}
  for i, name in ipairs(names) do
    local v = values[i]
    if v == false then v = defaults[i] end
    out[name] = v
  end
  return out
end
-- The values read (once per call), which policy hash they came from and whether it exists.
base.POLICY_READ = { values = nil, key = nil, found = false }
--@on-call
base.NOW = 0
do
  local read = base.POLICY_READ
  read.values, read.key, read.found = nil, nil, false
end
--@on-call-end
-- Where the library outlives a call (Redis >= 7, scripts/library.py), the table decoded from a packed policy is
-- kept under that packed string: the same bytes always decode to the same values, and a changed policy
-- is packed anew, so the cache can only miss, never be stale. Nothing changes these tables' values; what
-- is derived from them alone is kept in them, under table keys no policy name can be (policy_num,
-- advisory.lua advisory.read_flags). (With EVAL it lives for one call.) Bounded, as destinations may have many
-- distinct policies.
base.POLICY_DECODED = { n = 0, by_packed = {} }
function base.policy()
  local read = base.POLICY_READ
  if read.values then return read.values end
  -- The values scripts use are cached packed in one field, so a call reads one field, not fifteen;
  -- whoever rewrites the policy hash deletes '_packed' (ops/context.py, ops/forward.py).
  local key = base.K_POLICY
  local packed = redis.call('HGET', key, '_packed')
  local values
  read.key, read.found = key, packed ~= false
  if packed then
    local decoded = base.POLICY_DECODED
    local known = decoded.by_packed[packed]
    if known then
      read.values = known
      return known
    end
    values = cmsgpack.unpack(packed)
    if decoded.n >= 256 then decoded.n, decoded.by_packed = 0, {} end
    decoded.n = decoded.n + 1
    decoded.by_packed[packed] = base.with_defaults(base.POLICY_NAMES, base.POLICY_DEFAULTS, values)
    read.values = decoded.by_packed[packed]
    return read.values
  else
    values = redis.call('HMGET', key, unpack(base.POLICY_NAMES))
    if redis.call('EXISTS', key) == 1 then
      read.found = true
      redis.call('HSET', key, '_packed', cmsgpack.pack(values))
    end
  end
  read.values = base.with_defaults(base.POLICY_NAMES, base.POLICY_DEFAULTS, values)
  return read.values
end
function base.policy_flag(name)
  local v = (base.POLICY_READ.values or base.policy())[name]  -- (no call when it is read already)
  return v == '1' or v == 'true'
end
-- The numbers are kept in the values table too, under the key base.POLICY_DEFAULTS (no policy name): derived
-- from the values alone (see advisory.read_flags in advisory.lua).
function base.policy_num(name)
  local values = base.POLICY_READ.values or base.policy()
  local nums = values[base.POLICY_DEFAULTS]
  if not nums then
    nums = {}
    values[base.POLICY_DEFAULTS] = nums
  end
  local n = nums[name]
  if n == nil then
    n = tonumber(values[name]) or false
    nums[name] = n
  end
  return n or nil
end

-- Destinations are created on first use: the caller writes the resolved policy and retries.
-- The policy is read anyway (one HGET, cached for the call), and finding it answers the question.
function base.require_destination()
  local read = base.POLICY_READ
  if not read.values then base.policy() end
  if read.key == base.K_POLICY and read.found then return nil end
  if redis.call('EXISTS', base.K_POLICY) == 0 then
    return base.fail('NO_DESTINATION', 'destination ' .. base.P .. ' has no policy yet')
  end
  return nil
end

-- The operator's operations refuse a destination that does not exist rather than create its keys.
function base.unknown_destination()
  if redis.call('EXISTS', base.K_META) == 1 then return nil end
  local kind, name = string.match(base.P, '{(%a):(.*)}$')
  return base.fail('UNKNOWN_DESTINATION', 'no destination ' .. (kind == 't' and 'topic://' or 'queue://') .. name)
end

function base.meta_incr(field, by)
  return redis.call('HINCRBY', base.K_META, field, by or '1')  -- a string: Redis formats a number with snprintf
end

-- One command over many members of one key (HDEL, ZREM, HMGET, ...): one call instead of one per member,
-- in chunks (Lua's unpack has a stack limit). Returns the reply (of the last chunk), or the array
-- replies of all chunks joined.
base.CALL_CHUNK = 1000  -- (even: a chunk of field, value pairs ends with a value)
function base.call_many(command, key, members)
  local n = #members
  if n == 0 then return {} end  -- (nothing to do; Redis refuses the command without members)
  local chunk = base.CALL_CHUNK
  if n <= chunk then return redis.call(command, key, unpack(members)) end
  local joined, reply = nil, nil
  for i = 1, n, chunk do
    reply = redis.call(command, key, unpack(members, i, math.min(i + chunk - 1, n)))
    if type(reply) == 'table' then
      joined = joined or {}
      for k = 1, #reply do joined[#joined + 1] = reply[k] end
    end
  end
  return joined or reply
end

-- The maintenance index <ns>:due (broker_core/maintenance.py): key prefix -> the earliest time the tick
-- must look at that destination or subscription, so a tick visits what is due, not everything. A script
-- that creates work for the tick (a lease that can lapse, a parked message, a delayed start, a forward
-- to deliver) brings the prefix's entry forward to `at`, never back (LT); the tick's visit sets the entry
-- from what it finds (maintenance.lua `schedule`).
function base.due_at(prefix, at)
  redis.call('ZADD', string.match(prefix, '^(.-):{') .. ':due', 'LT', string.format('%d', at), prefix)
end

-- A queue's open browsers (gateway/ws/link.py browse; scripts/lua/browsers.lua): <P>:browsers, a zset of
-- browser id -> lease expiry (ms), renewed like consumers' leases. They take no part in dispatch; a live
-- one counts among the queue's consumers, as ActiveMQ's ConsumerCount counts its QueueBrowserSubscriptions.
-- Live: a lease not past (consumers' rule: maintenance.lua counts a lease lapsed once its end < now).
function base.live_browsers(prefix)
  return redis.call('ZCOUNT', (prefix or base.P) .. ':browsers', string.format('%d', base.NOW), '+inf')
end

-- Remove at most `limit` browsers whose lease lapsed (a gateway died with them open), each advised as a
-- consumer's removal; returns how many.
base.BROWSERS_PRUNED = 100  -- a call's most
function base.prune_browsers(limit)
  local key = base.P .. ':browsers'
  local lapsed = redis.call('ZRANGE', key, '-inf', '(' .. string.format('%d', base.NOW), 'BYSCORE', 'LIMIT', 0,
                            limit or base.BROWSERS_PRUNED)
  for _, id in ipairs(lapsed) do
    redis.call('ZREM', key, id)
    redis.call('HDEL', key .. ':def', id)
    base.emit('consumer_remove', 'consumer', id, 'reason', 'lease lapsed', 'browser', 1)
  end
  return #lapsed
end

-- events ActiveMQ advises about become advisory messages.
--@include advisory

-- Append one lifecycle event (docs/broker_core.md lists the types and fields).
-- A subscription's events carry its key ('sub') on the topic's stream.
-- NOW as text, formatted once per call rather than by Redis for every event (snprintf per number).
-- NOW_TEXT.get() is NOW for a command's argument: the text Redis would make of it ('%.17g', the same
-- digits as '%d' for a whole number), formatted once per call; NOW itself when it is not a whole number.
-- (NOW_TEXT.text, for the events, is the same text for a whole number.)
-- NOW_TEXT.num(n) likewise for a whole number below 2^53 (each from 0 to 4095 remembered as text, where the
-- library outlives a call); anything else is returned as it is, for Redis to format. Redis formats a number
-- argument with snprintf("%.17g"), several times the cost of a string argument.
-- base.NUMBERS is the other way round: each text NOW_TEXT.num made of a number from 0 to 4095 -> that number,
-- so a counter read back from Redis (the digits it was written with, or that HINCRBY made: the same) is a
-- table read rather than tonumber's strtod, several hundred instructions (`base.NUMBERS[s] or tonumber(s)`).
base.NOW_TEXT = { at = false, text = false, arg = false, nums = {}, keep = redis.register_function ~= nil,
                  set = false, get = false, num = false, n1 = false, t1 = false, n2 = false, t2 = false }
base.NUMBERS = {}
-- A number Redis replied with as text (or an argument's digits): from base.NUMBERS, or one of the two
-- texts NOW_TEXT.num made last (a counter this call or the one before wrote), else tonumber. nil for
-- nil or false, as tonumber.
function base.number(text)
  local n = base.NUMBERS[text]
  if n then return n end
  local t = base.NOW_TEXT
  if text == t.t1 and text then return t.n1 end
  if text == t.t2 and text then return t.n2 end
  return tonumber(text)
end
function base.NOW_TEXT.set()
  local now, t = base.NOW, base.NOW_TEXT
  t.at = now
  if now % 1 == 0 and now > 0 and now < 1e15 then
    t.text = string.format('%d', now)
    t.arg = t.text
  else
    t.text, t.arg = string.format('%.0f', now), now
  end
end
function base.NOW_TEXT.get()
  local t = base.NOW_TEXT
  if t.at ~= base.NOW then t.set() end
  return t.arg
end
function base.NOW_TEXT.num(n)
  local t = base.NOW_TEXT
  -- (the texts already made first, before the checks: a whole number from 0 to 4095 made before, or one
  -- of the two made last, is its text whatever those checks would say; -0 is the one number equal to such
  -- a number (0) whose text differs, '-0')
  local text = t.nums[n]
  if text and (n ~= 0 or 1 / n > 0) then return text end
  if n == t.n1 then return t.t1 end
  if n == t.n2 then return t.t2 end
  if n % 1 ~= 0 or n >= 9007199254740992 or n <= -9007199254740992 or (n == 0 and 1 / n < 0) then return n end
  if n < 0 or n >= 4096 then
    -- the two made last are kept (n1, n2): a message's sequence and dispatch sequence are each written
    -- more than once in a call (the audit, the pending and in-flight scores; the consumer's, the destination's)
    text = string.format('%d', n)
    t.n2, t.t2, t.n1, t.t1 = t.n1, t.t1, n, text
    return text
  end
  if not text then
    text = string.format('%d', n)
    if t.keep then
      t.nums[n] = text
      base.NUMBERS[text] = n
    end
  end
  return text
end
-- A call's first two events for a stream are written at once, an entry each (`type`, `ts`, then the
-- event's fields); from the third on they are gathered and written when the call ends (base.end_call,
-- which scripts/library.py puts around every body that uses base) as one entry (or one per
-- EVENTS_PER_ENTRY): `ts`, `n` and `e`, the events packed with msgpack as an array of arrays {type,
-- field, value, ...} in the order they happened (broker_core/event_stream.py reads both). A stream entry
-- costs Redis an XADD, its propagation to the AOF and, in Lua, its arguments: in sends, receives and acks
-- of many messages an entry per event was a third of the Redis work per message (docs/benchmarks.md),
-- while gathering one or two events costs a call more than it saves. The gathered events are lost only
-- if the call fails midway, a script error that leaves its writes half done too.
-- The events a stream holds are its entries plus `events_extra` (what its packed entries hold beyond one
-- each) in its owner's meta hash (the topic's for a subscription), which only packed writes and trims
-- change. Once per call that wrote events they are checked against the bound (eventsMaxLen, in events):
-- exactly after a packed write (HINCRBY answers the extra), else when the entries alone are over it (so
-- between packed writes a stream may hold up to its extra events more). Over it, the oldest entries go
-- (at most EVENTS_TRIM_MAX more than the events the call wrote: work in proportion to the call's), and the
-- events they held are counted (`events_trimmed`): trimming loses events only, never a message. Those of
-- them the event archive had not read (ids after its checkpoint's `last`, or its `pending` batch's last id:
-- analytics/archive.py) are counted apart (`events_lost`): the archive records them as a loss.
-- The streams a call has events for, in the order of their first event: each {stream, meta (its owner's),
-- cap, n events, list of those gathered}. The first stream's table and list are kept from call to call
-- and emptied once written (most calls write to one stream: a new table and its growth cost more than
-- the events).
base.EVENTS = { n = 0, first = { stream = false, meta = false, cap = 0, n = 0, list = {} }, more = {} }
base.EVENTS_TRIM_MAX = 10
base.EVENTS_PER_ENTRY = 100  -- (bounds what a trim reads, events_trim.lua; analytics/events.py numbers them)
base.EVENTS_AT_ONCE = 2
function base.clear_events()
  local ev = base.EVENTS
  local s = ev.first
  local list = s.list
  for i = #list, 1, -1 do list[i] = nil end
  s.stream, s.n = false, 0
  if ev.n > 1 then ev.more = {} end
  ev.n = 0
end
--@on-call
if base.EVENTS.n > 0 then base.clear_events() end  -- (a call that failed before end_call)
--@on-call-end
-- The current prefix's stream of the call's events (base.K_EVENTS), made at its first event.
function base.events_for(stream)
  local b = base
  local ev = b.EVENTS
  local s = ev.first
  if ev.n > 0 then
    local more = ev.more
    for i = 1, ev.n - 1 do
      if more[i].stream == stream then return more[i] end
    end
    s = { n = 0, list = {} }
    more[ev.n] = s
  end
  ev.n = ev.n + 1
  s.stream, s.meta, s.cap = stream, b.K_TMETA, b.policy_num('eventsMaxLen')
  return s
end
-- The events in a stream entry as XRANGE returns it ({id, {field, value, ...}}): 1, or its `n`.
function base.entry_events(entry)
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'n' then return tonumber(fields[i + 1]) end
  end
  return 1
end
-- Drop the stream's oldest entries: those with ids below `below` (a stream id; nil: no such bound), until
-- `over` events have gone (nil: no such bound), at most `limit` entries, read EVENTS_TRIM_MAX at a time;
-- `events_extra` follows. When the reading reached the stream's end (no `below`), every entry left was
-- read, and `events_extra` is set from them rather than adjusted: a count that went wrong (entries
-- removed by something else than this function) is right again there. Returns the entries and the events
-- dropped, and the events of those with ids after `after` ({ms, seq}; nil: none counted).
function base.drop_events(stream, meta, limit, below, over, after)
  local page_size, last = base.EVENTS_TRIM_MAX, below and ('(' .. below) or '+'
  local dropped, events, start, keep, last_id = 0, 0, '-', nil, nil
  local left, left_events, at_end, unread = 0, 0, false, 0
  while true do
    local page = redis.call('XRANGE', stream, start, last, 'COUNT', page_size)
    for i = 1, #page do
      if keep or dropped >= limit or (over and events >= over) then
        keep = keep or page[i][1]
        left, left_events = left + 1, left_events + base.entry_events(page[i])
      else
        local n = base.entry_events(page[i])
        dropped, events, last_id = dropped + 1, events + n, page[i][1]
        if after and base.id_after(last_id, after) then unread = unread + n end
      end
    end
    if #page < page_size then
      at_end = below == nil
      break
    end
    if keep then break end
    start = '(' .. page[#page][1]
  end
  if dropped > 0 then
    if not keep then  -- (nothing younger read: the bound is the id after the last one dropped)
      local ms, seq = string.match(last_id, '^(%d+)-(%d+)$')
      keep = ms .. '-' .. string.format('%d', tonumber(seq) + 1)
    end
    redis.call('XTRIM', stream, 'MINID', keep)
  end
  if at_end then
    redis.call('HSET', meta, 'events_extra', base.NOW_TEXT.num(left_events - left))
  elseif events > dropped then
    redis.call('HINCRBY', meta, 'events_extra', base.NOW_TEXT.num(dropped - events))
  end
  return dropped, events, unread
end
-- Whether stream id `id` ("ms-seq") comes after `bound` ({ms, seq}).
function base.id_after(id, bound)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  ms, seq = tonumber(ms), tonumber(seq)
  return ms > bound[1] or (ms == bound[1] and seq > bound[2])
end
-- What the event archive has read of the stream whose owner's meta hash is `meta`: {ms, seq} of its
-- pending batch's last id, else of its checkpoint's `last` ({-1, -1}: nothing; analytics/archive.py).
function base.archived_bound(meta)
  local state = redis.call('HMGET', string.sub(meta, 1, -6) .. ':archive', 'pending', 'last')
  local id = state[1] and string.match(state[1], ' (%S+)$') or state[2]
  local ms, seq = string.match(id or '', '^(%d+)-(%d+)$')
  if not ms then return { -1, -1 } end
  return { tonumber(ms), tonumber(seq) }
end
function base.write_stream(s, ts)
  local stream, meta, list = s.stream, s.meta, s.list
  local gathered, num, extra = #list, base.NOW_TEXT.num, nil
  if gathered == 1 then
    local e = list[1]
    redis.call('XADD', stream, '*', 'type', e[1], 'ts', ts, unpack(e, 2))
  elseif gathered > 1 then
    local per, entries = base.EVENTS_PER_ENTRY, 0
    for first = 1, gathered, per do
      local last = math.min(first + per - 1, gathered)
      local part = (first == 1 and last == gathered) and list or { unpack(list, first, last) }
      redis.call('XADD', stream, '*', 'ts', ts, 'n', num(last - first + 1), 'e', cmsgpack.pack(part))
      entries = entries + 1
    end
    extra = redis.call('HINCRBY', meta, 'events_extra', num(gathered - entries))
  end
  local entries, cap = redis.call('XLEN', stream), s.cap
  if entries > cap or (extra and entries + extra > cap) then
    local held = entries + (extra or base.number(redis.call('HGET', meta, 'events_extra')) or 0)
    if held > cap then
      local _, gone, unread = base.drop_events(stream, meta, s.n + base.EVENTS_TRIM_MAX, nil, held - cap,
                                               base.archived_bound(meta))
      redis.call('HINCRBY', meta, 'events_trimmed', num(gone))
      if unread > 0 then redis.call('HINCRBY', meta, 'events_lost', num(unread)) end
    end
  end
end
function base.end_call(result)
  if base.STEP_OF then  -- a step of a commit that ran (begin_call): its end, or its refusal
    if type(result) == 'table' and result.err then
      redis.call('SET', base.refusal_key(base.STEP_OF), result.err)
    else
      redis.call('DEL', base.refusal_key(base.STEP_OF))
    end
  end
  local ev = base.EVENTS
  if ev.n == 0 then return result end
  local t = base.NOW_TEXT
  if t.at ~= base.NOW then t.set() end
  base.write_stream(ev.first, t.text)
  for i = 1, ev.n - 1 do base.write_stream(ev.more[i], t.text) end
  base.clear_events()
  return result
end
-- An event about the message whose packed form is `blob`: its advisory, if any, carries a copy
-- (advisory.lua; the message may be gone from K_MSGS already, or not written yet). `emit` below is the
-- same without one. A subscription's events carry its key ('sub') on the topic's stream.
function base.emit_message(blob, kind, ...)
  local b = base
  local s, stream = b.EVENTS.first, b.K_EVENTS
  if s.stream ~= stream then s = b.events_for(stream) end
  local n = s.n + 1
  s.n = n
  if n <= b.EVENTS_AT_ONCE then
    local t = b.NOW_TEXT
    if t.at ~= b.NOW then t.set() end
    if b.SUB then
      redis.call('XADD', stream, '*', 'type', kind, 'ts', t.text, 'sub', b.SUB, ...)
    else
      redis.call('XADD', stream, '*', 'type', kind, 'ts', t.text, ...)
    end
  else
    local list = s.list
    if b.SUB then list[#list + 1] = { kind, 'sub', b.SUB, ... } else list[#list + 1] = { kind, ... } end
  end
  -- (no call for an event type the policy's advisory flags, once read, leave unadvised: advisory.read_flags)
  local flags = advisory.flags
  if not flags or flags[advisory.EVENTS][kind] then advisory.advise(kind, blob, ...) end
end
function base.emit(kind, ...)
  return base.emit_message(nil, kind, ...)
end

-- Memory usage and producer flow control : every script keeps the counts.
--@include flow
