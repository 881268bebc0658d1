-- Messages: their packed form, their order in the pending zset, what a selector sees of them, and the
-- dispatch pass's dirty flags. Its module table is `message`.
-- Per call (reset below): fresh, pass_dirty, dest_uri.
local message = { fresh = {}, pass_dirty = false, dest_uri = nil }

-- Packed message layout (msgpack array written by broker_core/messages.py; 1-based Lua indexes).
message.VERSION, message.PRIORITY, message.PERSISTENT, message.TIMESTAMP, message.EXPIRATION = 1, 2, 3, 4, 5
message.CORRELATION, message.REPLY_TO, message.TYPE, message.GROUP, message.GROUP_SEQ = 6, 7, 8, 9, 10
message.CONNECTION, message.PROPS, message.CONTENT_TYPE, message.BODY_KIND, message.BODY = 11, 12, 13, 14, 15
message.USER, message.ORIG_DEST, message.DELAY, message.PERIOD, message.REPEAT = 16, 17, 18, 19, 20
-- (21: a cron schedule's compact form, packed only when the message has one: includes/cron.lua)
message.CRON = 21
-- (22: a wildcard subscription's copy's topic; 23, always last: when the message last reached a
-- destination, messages.py ARRIVED, read by message.arrived)
message.ARRIVED = 23
-- A delay or period the producer gave as 0 (messages.py GIVEN_ZERO; 0 there is none given): the message is
-- a scheduler job all the same, due now, as ActiveMQ's SchedulerBroker makes one of every message with the
-- property present.
message.GIVEN_ZERO = -1

-- A delay or period field in ms (GIVEN_ZERO and none are 0).
function message.schedule_ms(value)
  value = tonumber(value) or 0
  return value > 0 and value or 0
end

-- Whether a message that neither repeats nor has a cron form is a job with one firing: a delay or a period
-- given, 0 included (messages.py Message.delay_ms, GIVEN_ZERO); due after its delay.
function message.delayed(m)
  return (tonumber(m[message.DELAY]) or 0) ~= 0 or (tonumber(m[message.PERIOD]) or 0) ~= 0
end

-- A message's cron form, or nil. Only a table is one: a wildcard subscription's copy packed before this field
-- existed has the topic it was published to there (messages.py PUBLISHED_TO, now the 22nd).
function message.cron(m)
  local form = m[message.CRON]
  if type(form) == 'table' then return form end
  return nil
end

-- A packed message is one msgpack array; Python packs it as an array16 (tag 0xdc, then a 2-byte length).
-- cmsgpack.unpack builds the decoded table one element at a time (regrowing it at each power of two),
-- which costs several times what decoding the elements does. Its elements are also a sequence of msgpack
-- values starting after that 3-byte header: unpack_limit returns them as values, and a table made from
-- them is made at its size (same values, same indexes). Anything else is decoded by cmsgpack.unpack.
-- A large message's body is skipped, not decoded (m[message.BODY] is false): no script reads a body, and
-- decoding one copies it whole into a new Lua string, a third of what storing a 1 MiB message costs (the
-- first touch of fresh memory: bench/adversarial.py, "largest message"). Small ones are decoded whole, in
-- one call, which costs less than skipping.
message.SKIP_BODY_FROM = 64 * 1024

-- The string header at 0-based offset `at` of `blob` (msgpack str or bin): its size and the header's.
function message.string_at(blob, at)
  local b, x1, x2, x3, x4 = string.byte(blob, at + 1, at + 5)
  if b >= 0xa0 and b <= 0xbf then return b - 0xa0, 1 end
  if b == 0xd9 or b == 0xc4 then return x1, 2 end
  if b == 0xda or b == 0xc5 then return x1 * 256 + x2, 3 end
  if b == 0xdb or b == 0xc6 then return ((x1 * 256 + x2) * 256 + x3) * 256 + x4, 5 end
  return nil
end

-- Fields from index `from` on: the values unpack_limit gives after its offset (nil ones too).
function message.put_fields(m, from, ...)
  for i = 2, select('#', ...) do m[from + i - 2] = (select(i, ...)) end
  return m
end

function message.unpack(blob)
  local tag, high, low = string.byte(blob, 1, 3)
  if tag ~= 0xdc or not low then return cmsgpack.unpack(blob) end
  local count = high * 256 + low
  if #blob < message.SKIP_BODY_FROM or count < message.BODY then
    return { select(2, cmsgpack.unpack_limit(blob, count, 3)) }
  end
  local head = { cmsgpack.unpack_limit(blob, message.BODY_KIND, 3) }  -- (the body's offset, then fields)
  local size, header = message.string_at(blob, head[1])
  if not size then return { select(2, cmsgpack.unpack_limit(blob, count, 3)) } end  -- not a string: whole
  local m = message.put_fields({}, 1, unpack(head, 1, message.BODY_KIND + 1))
  m[message.BODY] = false
  if count == message.BODY then return m end
  local after = head[1] + header + size
  return message.put_fields(m, message.BODY + 1, cmsgpack.unpack_limit(blob, count - message.BODY, after))
end

-- The fields the dispatch loop and the expiry check read, without decoding the whole message (its body,
-- its properties): expiration (as is_expired reads it), and with `group` also the group id, group sequence
-- and connection (message.GROUP, message.GROUP_SEQ, message.CONNECTION as message.unpack gives them): the first fields of
-- the array decoded as values (see message.unpack), no table. nil for a message not packed as Python
-- packs it; the caller then decodes it whole.
function message.head(blob, group)
  local tag, high, low = string.byte(blob, 1, 3)
  if tag ~= 0xdc or not low or high * 256 + low < message.CONNECTION then return nil end
  if not group then
    local _, _, _, _, _, exp = cmsgpack.unpack_limit(blob, message.EXPIRATION, 3)
    return tonumber(exp) or 0
  end
  local _, _, _, _, _, exp, _, _, _, gid, seq, conn = cmsgpack.unpack_limit(blob, message.CONNECTION, 3)
  return tonumber(exp) or 0, gid, tonumber(seq) or 0, conn
end

-- Messages this script call stored (id -> {packed, unpacked}), so the dispatch chunk that follows a
-- send hands them out without reading and decoding them again. An entry is used once; a message that
-- leaves (drop_message) loses it.
-- (message.fresh, reset with pass_dirty, below)

-- A scheduled message reaching its destination (a delayed one due, a repeating job's firing): ActiveMQ's
-- SchedulerBroker sends it with its time to live started again, timestamp now and expiration now plus
-- (expiration - timestamp), when it has both and that is later; one without an expiration keeps its
-- timestamp. Returns the packed message and its fields, rewritten (`m` with them) or as they were. Only
-- the array's first five values are written again; the rest of the bytes, the body among them, are kept.
-- Its arrival (message.ARRIVED) is now in any case: the scheduler's send is a send (RegionBroker.send sets
-- brokerInTime), so its enqueue time starts at the firing.
function message.restamp(blob, m)
  blob = message.arrive(blob, m)
  local stamp, exp = tonumber(m[message.TIMESTAMP]) or 0, tonumber(m[message.EXPIRATION]) or 0
  if stamp <= 0 or exp <= 0 or base.NOW + exp - stamp <= exp then return blob, m end
  if string.byte(blob, 1) ~= 0xdc then return blob, m end  -- (not packed as Python packs it: kept)
  local after, version, priority, persistent = cmsgpack.unpack_limit(blob, message.EXPIRATION, 3)
  m[message.TIMESTAMP], m[message.EXPIRATION] = base.NOW, base.NOW + exp - stamp
  return string.sub(blob, 1, 3) .. cmsgpack.pack(version, priority, persistent, base.NOW, base.NOW + exp - stamp)
    .. string.sub(blob, after + 1), m
end

-- When the message last reached a destination (ms), read off the end of its packed form (messages.py
-- ARRIVED: the last of 23 fields, a uint64: 0xcf and 8 bytes, big-endian) without decoding it; nil for a
-- record stored before that field (not timed). Two C calls, ~3 k instructions a dispatch, most of it the
-- calls themselves (struct's one read of the tail costs 0.5 k less than string.byte's nine values):
-- docs/benchmarks.md "Session 29".
function message.arrived(blob)
  local tag, high, low = string.byte(blob, 1, 3)
  if tag ~= 0xdc or high * 256 + low ~= message.ARRIVED then return nil end
  local t, at = struct.unpack('>BI8', blob, #blob - 8)
  if t ~= 0xcf then return nil end
  return at
end

-- `blob` (its fields `m`) arriving now: its ARRIVED rewritten in place (the bytes before it kept), m's too.
-- A record without the field (stored before it) is kept as it is.
function message.arrive(blob, m)
  if not message.arrived(blob) then return blob end
  local bytes, at = {}, base.NOW
  for i = 8, 1, -1 do
    bytes[i] = at % 256
    at = (at - bytes[i]) / 256
  end
  m[message.ARRIVED] = base.NOW
  return string.sub(blob, 1, #blob - 8) .. string.char(unpack(bytes))
end

function message.is_expired(m)
  local exp = tonumber(m[message.EXPIRATION]) or 0
  return exp > 0 and base.NOW > exp
end

-- Order in the pending zset. FIFO by broker sequence; with prioritizedMessages, strict 9..0 first.
message.PRIORITY_BAND = 17592186044416   -- 2^44: room for the broker sequence inside one band
message.REDELIVERY_BAND = 35184372088832 -- 2^45: redelivered messages sort before fresh ones
-- a non-durable subscription's pending list ignores it (TopicSubscription's cursor is built with
-- prioritizedMessages=false); its key starts with 'c.' (topics.non_durable_key).
function message.prioritized()
  return base.policy_flag('prioritizedMessages') and not (base.SUB and string.sub(base.SUB, 1, 2) == 'c.')
end
function message.pending_score(seq, priority)
  if message.prioritized() then
    local p = tonumber(priority) or 4
    if p < 0 then p = 0 elseif p > 9 then p = 9 end
    return (9 - p) * message.PRIORITY_BAND + seq
  end
  return seq
end
-- Without message priority, returned messages go ahead of fresh ones (ActiveMQ's
-- redeliveredWaitingDispatch); with it, they merge back into priority order at their old place.
function message.redelivery_score(score)
  if message.prioritized() or score < 0 then return score end
  return score - message.REDELIVERY_BAND
end

-- The job a scheduled message's firing came from: the scheduledJobId property the copy a topic's job
-- publishes carries (messages.forward_copy, SchedulerBroker's), or nil. Asked of forwarded messages only:
-- a producer may set that property on anything.
function message.job_of(m)
  local flat = m[message.PROPS]
  if type(flat) ~= 'table' then return nil end
  for i = 1, #flat, 3 do
    if flat[i] == 'scheduledJobId' then return flat[i + 2] end
  end
  return nil
end

-- The table the selector evaluator reads (scripts/lua/includes/selector.lua).
-- (message.dest_uri: this destination's uri, read once per call; reset with pass_dirty, below)
function message.selector_view(id, m)
  if not message.dest_uri then message.dest_uri = redis.call('HGET', base.K_META, 'uri') or '' end
  local props = {}
  local flat = m[message.PROPS]
  if type(flat) == 'table' then
    for i = 1, #flat, 3 do props[flat[i]] = { flat[i + 1], flat[i + 2] } end
  end
  local persistent = m[message.PERSISTENT]
  return {
    id = id, dest = message.dest_uri, orig_dest = m[message.ORIG_DEST] or nil, reply_to = m[message.REPLY_TO] or nil,
    type = m[message.TYPE] or nil, corr_id = m[message.CORRELATION] or nil, user_id = m[message.USER] or nil,
    priority = tonumber(m[message.PRIORITY]) or 4, persistent = (persistent == true or persistent == 1),
    timestamp = tonumber(m[message.TIMESTAMP]) or 0, expiration = tonumber(m[message.EXPIRATION]) or 0,
    redelivery = tonumber(redis.call('HGET', base.K_REDELIV, id)) or 0,
    group_id = m[message.GROUP] or nil, group_seq = tonumber(m[message.GROUP_SEQ]) or 0,
    group_first = redis.call('SISMEMBER', base.K_GFIRST, id) == 1,
    props = props,
  }
end

-- Something may have made a message behind the pass cursor dispatchable: the pass restarts from the head
-- when it reaches the tail (from where it first left a full consumer out, when all that happened is that
-- such a consumer has room again: mark_room). `message.pass_dirty` tells a chunk already running in this script
-- call.
-- message.pass_dirty.passfull: the members of the set K_PASSFULL names, read by room_freed for the dispatch
-- chunk that follows (dispatch.lua); whatever writes the set forgets it (message.pass_dirty.passfull_key = nil).
-- message.pass_dirty.pending: the pending zset this call added to (pending_add) and has taken nothing from since,
-- so it is not empty; whatever removes from it forgets it.
-- message.pass_dirty.in_pass: a dispatch pass is running, and writes 'dirty' with its state when it ends.
message.pass_dirty = { value = false, passfull_key = nil, passfull = nil, pending = nil, in_pass = false }
--@on-call
do
  local dirty = message.pass_dirty
  dirty.value, dirty.passfull_key, dirty.passfull, dirty.pending, dirty.in_pass = false, nil, nil, nil, false
end
if next(message.fresh) ~= nil then message.fresh = {} end  -- (an empty one is as good as a new one)
message.dest_uri = nil
message.sizes = nil
--@on-call-end

-- ActiveMQ's DestinationStatistics messageSize (its MBeans' AverageMessageSize, MinMessageSize and
-- MaxMessageSize): each message the destination counts enqueued adds its size (Queue.messageSent,
-- Topic.dispatch: a scheduled message when it arrives, not when it was sent; never a duplicate or one
-- expired on arrival). Its size here is what its memory usage counts (flow.message_charge: packed bytes, at
-- least minimumMessageSize), as ActiveMQ's Message.getSize is what its MemoryUsage counts. Kept in the
-- destination's meta as one field, 'msgsize': "<count> <sum> <smallest> <largest>", read and written with
-- the counters a send already reads and writes, no command of its own (four fields cost a one-message
-- send 8 % more Redis instructions, this one under 3 %: docs/benchmarks.md "Session 29"). send.lua keeps
-- a send's sizes in locals and writes them with its counters; elsewhere a call notes them here
-- (message.sizes: n, sum, min, max) and writes them once (message.sizes_write).
function message.size_note(size)
  local s = message.sizes
  if not s then
    message.sizes = { 1, size, size, size }
    return
  end
  s[1], s[2] = s[1] + 1, s[2] + size
  if size < s[3] then s[3] = size end
  if size > s[4] then s[4] = size end
end

-- A meta field's "<count> <sum> <smallest> <largest>" ('msgsize', 'enqtime') as numbers, nil when there
-- is none. `made` keeps the last value made and its numbers (message.tally_text): where Redis keeps the
-- library between calls, the next call on the same destination reads back that value and parses nothing
-- (string.match and four tonumber's strtod: ~5 k instructions in a send's profile); a value's text says
-- all its numbers, so a kept one is never stale.
function message.tally_read(stored, made)
  if not stored then return nil end
  if stored == made.text then return made.n, made.sum, made.least, made.most end
  local n, sum, least, most = string.match(stored, '^(%d+) (%d+) (%d+) (%d+)$')
  if not n then return nil end
  return tonumber(n), tonumber(sum), tonumber(least), tonumber(most)
end

-- The field's value for these numbers, kept in `made` for tally_read. ('%d': the integer conversion, a
-- fraction of the cost of the float one that '%.0f' or tostring make)
function message.tally_text(made, n, sum, least, most)
  local text = string.format('%d %d %d %d', n, sum, least, most)
  made.text, made.n, made.sum, made.least, made.most = text, n, sum, least, most
  return text
end

-- The 'msgsize' value of `stored` (as read: false when none yet) with n more sizes of sum `sum`, smallest
-- `least`, largest `most`.
message.size_made = { text = false, n = 0, sum = 0, least = 0, most = 0 }
function message.size_added(stored, n, sum, least, most)
  local had_n, had_sum, had_min, had_max = message.tally_read(stored, message.size_made)
  if had_n then
    n, sum = n + had_n, sum + had_sum
    if had_min < least then least = had_min end
    if had_max > most then most = had_max end
  end
  return message.tally_text(message.size_made, n, sum, least, most)
end

-- Write the sizes this call noted to meta hash `key` (two commands, whatever their number).
function message.sizes_write(key)
  local s = message.sizes
  if not s then return end
  message.sizes = nil
  local stored = redis.call('HGET', key, 'msgsize')
  redis.call('HSET', key, 'msgsize', message.size_added(stored, s[1], s[2], s[3], s[4]))
end

-- ActiveMQ's DestinationStatistics processTime (its MBeans' AverageEnqueueTime, MinEnqueueTime and
-- MaxEnqueueTime, a TimeStatisticImpl): each dispatch adds now minus the time the message last reached the
-- broker (RegionBroker.preProcessDispatch), redeliveries and each topic subscriber's dispatch included.
-- Kept in the destination's meta as one field, 'enqtime': "<count> <sum> <smallest> <largest>" (ms), as
-- 'msgsize'; a topic's on the topic, whichever subscription dispatched. `stored`: the value as read (false
-- when none yet); `times`: this pass's times, in order. The smallest follows TimeStatisticImpl.addTime: a
-- time replaces it when smaller or when it is 0 (so a 0 holds only until the next time).
message.times_made = { text = false, n = 0, sum = 0, least = 0, most = 0 }
function message.times_added(stored, times)
  local n, sum, least, most = message.tally_read(stored, message.times_made)
  if not n then n, sum, least, most = 0, 0, 0, 0 end
  for i = 1, #times do
    local t = times[i]
    n, sum = n + 1, sum + t
    if t > most then most = t end
    if t < least or least == 0 then least = t end
  end
  return message.tally_text(message.times_made, n, sum, least, most)
end

function message.mark_dirty()
  message.pass_dirty.value = true
  if not message.pass_dirty.in_pass then redis.call('HSET', base.K_META, 'dirty', '1') end
end
-- Room freed for a consumer the pass left out for being full: the pass walks again, but only from where it
-- first left one out (dispatch.lua 'resume'); message.pass_dirty.value 'room' unless something else needs more.
function message.mark_room()
  if message.pass_dirty.value == false then message.pass_dirty.value = 'room' end
  if not message.pass_dirty.in_pass then redis.call('HSET', base.K_META, 'dirty_room', '1') end
end

-- A consumer got room back. It needs a fresh pass only if this pass left it out for being full; a
-- consumer that had room all along has already seen every message up to the cursor.
function message.room_freed(cid)
  -- (read once per call: whatever writes the set forgets what was read, message.pass_dirty.passfull_key = nil)
  local members = message.pass_dirty.passfull_key == base.K_PASSFULL and message.pass_dirty.passfull
                  or redis.call('SMEMBERS', base.K_PASSFULL)
  message.pass_dirty.passfull_key, message.pass_dirty.passfull = base.K_PASSFULL, members
  for i = 1, #members do
    if members[i] == cid then
      message.mark_room()
      return
    end
  end
end

-- A consumer joins the dispatch (new, or back from a lapsed lease): mid-pass it waits for the next
-- pass, so it sees the messages from the head in order.
function message.consumer_joined(cid)
  local cursor = redis.call('HGET', base.K_META, 'cursor')
  if cursor and cursor ~= '' then
    redis.call('SADD', base.K_PASSFULL, cid)
    message.pass_dirty.passfull_key = nil
  end
  message.mark_dirty()
end

function message.renew_lease(cid, lease_ms, old)
  if old == nil then old = redis.call('ZSCORE', base.K_LEASES, cid) end  -- (`old`: as find_consumer read it)
  redis.call('ZADD', base.K_LEASES, base.NOW_TEXT.num(base.NOW + lease_ms), cid)
  -- the index entry is no later than the old end (+1), so only an earlier end needs writing there
  if not old or tonumber(old) > base.NOW + lease_ms then base.due_at(base.P, base.NOW + lease_ms + 1) end
  if old and tonumber(old) < base.NOW then message.consumer_joined(cid) end
end

-- Start the next dispatch pass at the head now: freed groups or a changed exclusive owner can make
-- earlier messages dispatchable, and they must go before later ones (ActiveMQ iterates from the head).
function message.reset_pass()
  redis.call('HSET', base.K_META, 'cursor', '', 'dirty', '0', 'dirty_room', '0', 'resume', '-', 'offered', '')
  redis.call('DEL', base.K_PASSFULL)
  message.pass_dirty.passfull_key = nil
end

-- Put messages into the pending zset: `entries` is score (as text), id, ... for one ZADD; `lowest` the
-- lowest score. One placed behind the pass cursor needs a restarted pass. `cursor`: the pass cursor
-- (K_META's field) when the caller has read it, else it is read here.
function message.pending_add_many(entries, lowest, cursor)
  base.call_many('ZADD', base.K_PENDING, entries)
  message.pass_dirty.pending = base.K_PENDING
  if cursor == nil then cursor = redis.call('HGET', base.K_META, 'cursor') end
  if cursor and cursor ~= '' and lowest <= tonumber(cursor) then message.mark_dirty() end
end
function message.pending_add(id, score) message.pending_add_many({ base.NOW_TEXT.num(score), id }, score) end

-- A send's messages checked against the destination's limits before any is stored, so a refused batch
-- changes nothing: the unpacked messages by argument index (`argv`, the script's ARGV: from 4 on it holds `step` values per message,
-- its id and packed form first), or the fail() reply. Forwarded messages (dead letters, moves, copies)
-- were accepted once already and are not refused now.
-- The room a producer's send (`argv`, its messages every `step` from 4, `unpacked` by unpack_send) needs
-- (spec §9.2): the charge of each message not expired. Queue.send and Topic.send expire an expired one
-- before they look at the memory, so it is neither blocked nor refused (0: nothing to check).
function message.send_need(argv, unpacked, step)
  local need = 0
  for i = 4, #argv, step do
    if not message.is_expired(unpacked[i]) then need = need + flow.message_charge(#argv[i + 1]) end
  end
  return need
end

function message.unpack_send(argv, origin, step)
  local limit = base.policy_num('maxMessageSize') or 0
  local max_props = base.policy_num('maxPropertyCount') or 0
  if origin == 'forward' then limit, max_props = 0, 0 end
  -- origin 'check' gives each message as id, its packed size, and itself packed without its body (calls.py
  -- _check): the body a check does not read stays out of its call
  local sized = origin == 'check'
  local unpacked = { nil, nil, nil, nil }  -- (the first message's index, 4, in its array part)
  for i = 4, #argv, step do
    local id, blob = argv[i], argv[i + 1]
    local size = #blob
    if sized then size, blob = tonumber(blob), argv[i + 2] end
    if limit > 0 and size > limit then
      return base.fail('MESSAGE_TOO_LARGE', 'message ' .. id .. ' is ' .. size ..
        ' bytes packed, over the destination limit maxMessageSize=' .. limit)
    end
    local m = message.unpack(blob)
    local props = m[message.PROPS]
    if max_props > 0 and type(props) == 'table' and #props / 3 > max_props then
      return base.fail('TOO_MANY_PROPERTIES', 'message ' .. id .. ' has ' .. (#props / 3) ..
        ' properties, over the destination limit maxPropertyCount=' .. max_props)
    end
    unpacked[i] = m
  end
  return unpacked
end
