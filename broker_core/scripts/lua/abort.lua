-- Slow consumers (spec §8.2, §8.3): one run of the destination's abort strategy, or an operator's abort.
--
-- ActiveMQ keeps the strategy's list of slow subscriptions (markCount, slowCount) in memory; here it is
-- the hash <prefix>:slowcons (consumer id -> packed {markCount, slowCount, slow_since seen}), so any
-- worker can run the next check. An aborted consumer is closed as any other (§1.8: unacked messages
-- return with the redelivery counter raised, groups freed, exclusivity handed on) and leaves a tombstone
-- in <prefix>:aborted (consumer id -> JSON {reason, abort_connection, strategy, at}) so the adapter that
-- served it can tell its client why; tombstones are bounded in number and age.
--
-- KEYS[1] = the destination's prefix. ARGV: now, budget (0 = maxPageSize), tombstones kept at most,
-- tombstone lifetime (ms), op, then per op:
--   check strategy checkPeriod maxSlowDuration maxSlowCount abortConnection maxTimeSinceLastAck
--         ignoreIdleConsumers
--         Runs only when checkPeriod has passed since the last run (so several workers, or a repeated
--         call, mark each consumer once per period).
--   abort consumer reason abortConnection
-- Returns {ran (0: not due), tracked, aborted consumer ids..., the tail (includes/dispatch.lua dispatch.add_tail)}. The aborted
-- consumers' messages are all owed: the caller returns them with return_owed.lua.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local budget = tonumber(ARGV[2])
local TOMBSTONES_MAX = tonumber(ARGV[3])
local TOMBSTONE_MS = tonumber(ARGV[4])
local op = ARGV[5]

local K_SLOW = base.P .. ':slowcons'     -- hash: consumer id -> packed {markCount, slowCount, slow_since seen}
local K_MAINT = base.P .. ':maint'       -- hash: maintenance job state (broker_core/maintenance.py)
local K_ABORTED = base.TP .. ':aborted'  -- hash: consumer id -> JSON tombstone (a topic's live on the topic)
local K_ABORTED_AT = base.TP .. ':aborted:at'  -- zset: consumer id -> time of the abort (oldest go first)
local KEEP_MS = 7 * 86400000  -- bookkeeping of a destination no worker maintains any more goes away

local function ms(n) return string.format('%d', n) end

local function forget_tombstones(ids)
  if #ids > 0 then
    redis.call('HDEL', K_ABORTED, unpack(ids))
    redis.call('ZREM', K_ABORTED_AT, unpack(ids))
  end
end

-- Close consumer `cid` for being slow (or on an operator's word) and leave its tombstone.
local function abort(cid, reason, abort_connection, strategy)
  local c = consumers.find(cid)
  local notify = c and c.def.notify
  base.emit('abort', 'consumer', cid, 'reason', reason, 'abort_connection', abort_connection and 1 or 0,
       'strategy', strategy)
  lifecycle.close_consumer(cid, 'aborted', 0)  -- its messages go back in the calls that follow (return_owed.lua)
  redis.call('HSET', K_ABORTED, cid, cjson.encode({
    reason = reason, abort_connection = abort_connection, strategy = strategy, at = ms(base.NOW),
  }))
  redis.call('ZADD', K_ABORTED_AT, base.NOW, cid)
  forget_tombstones(redis.call('ZRANGEBYSCORE', K_ABORTED_AT, '-inf', '(' .. ms(base.NOW - TOMBSTONE_MS),
                               'LIMIT', 0, 100))
  local over = redis.call('ZCARD', K_ABORTED_AT) - TOMBSTONES_MAX
  if over > 0 then forget_tombstones(redis.call('ZRANGE', K_ABORTED_AT, 0, over - 1)) end
  redis.call('PEXPIRE', K_ABORTED, TOMBSTONE_MS)
  redis.call('PEXPIRE', K_ABORTED_AT, TOMBSTONE_MS)
  -- Wake the adapter serving the consumer (as a dispatch does): it finds the consumer gone and the
  -- tombstone there, and tells its client now rather than at its next lease renewal.
  if notify then redis.call('PUBLISH', notify, cid) end
end

local function finish(ran, tracked, aborted)
  local dispatched, more, hold = 0, 0, 0
  if #aborted > 0 then dispatched, more, hold = dispatch.chunk(budget) end
  local out = {ran, tracked}
  for _, cid in ipairs(aborted) do out[#out + 1] = cid end
  dispatch.add_tail(out, dispatched, more, hold)
  return out
end

if op == 'abort' then
  local err = base.require_destination()
  if err then return err end
  local cid = ARGV[6]
  if redis.call('HEXISTS', base.K_CONSUMERS, cid) == 0 then
    return base.fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination')
  end
  abort(cid, ARGV[7], ARGV[8] == '1', 'operator')
  redis.call('HDEL', K_SLOW, cid)
  return finish(1, redis.call('HLEN', K_SLOW), {cid})
end

if op ~= 'check' then
  return redis.error_reply('INVALID_OPERATION unknown slow-consumer operation ' .. tostring(op))
end

local err = base.require_destination()
if err then return err end
local strategy = ARGV[6]
local check_period = tonumber(ARGV[7])
local max_duration = tonumber(ARGV[8])
local max_count = tonumber(ARGV[9])
local abort_connection = ARGV[10] == '1'
local max_since_ack = tonumber(ARGV[11])
local ignore_idle = ARGV[12] == '1'

local last = tonumber(redis.call('HGET', K_MAINT, 'slow:last_run') or '')
if last and base.NOW < last + check_period then return finish(0, redis.call('HLEN', K_SLOW), {}) end
-- A changed strategy or changed numbers start a new list, as a new strategy instance would.
local config = table.concat({strategy, check_period, max_duration, max_count, max_since_ack,
                             ignore_idle and 1 or 0}, ' ')
if redis.call('HGET', K_MAINT, 'slow:config') ~= config then redis.call('DEL', K_SLOW) end
redis.call('HSET', K_MAINT, 'slow:last_run', ms(base.NOW), 'slow:config', config)
redis.call('PEXPIRE', K_MAINT, KEEP_MS)

local cons = consumers.load()
local tracked = {}
local stored = redis.call('HGETALL', K_SLOW)
for i = 1, #stored, 2 do tracked[stored[i]] = cmsgpack.unpack(stored[i + 1]) end
local live = {}
for _, c in ipairs(cons) do live[c.id] = c end
for cid in pairs(tracked) do
  if not live[cid] then tracked[cid] = nil end  -- closed since the last run
end

local function mark_all()
  if max_duration > 0 then
    for _, e in pairs(tracked) do e[1] = e[1] + 1 end
  end
end

local function track(c, marks, detail)
  tracked[c.id] = {marks, 1, redis.call('HGET', base.K_C(c.id), 'slow_since') or ''}
  base.emit('slow_consumer', 'consumer', c.id, 'strategy', strategy, 'detail', detail)
end

local function qualifies(e)
  return (max_duration > 0 and e[1] * check_period >= max_duration) or (max_count > 0 and e[2] >= max_count)
end

local function why(e, prefix)
  local parts = {}
  if max_duration > 0 and e[1] * check_period >= max_duration then
    parts[#parts + 1] = 'slow for ' .. ms(e[1] * check_period) .. ' ms (maxSlowDuration '
                        .. ms(max_duration) .. ' ms)'
  end
  if max_count > 0 and e[2] >= max_count then
    parts[#parts + 1] = 'slow ' .. e[2] .. ' times (maxSlowCount ' .. max_count .. ')'
  end
  return 'aborted by ' .. strategy .. 'Strategy: ' .. prefix .. table.concat(parts, ', ')
end

local to_abort = {}

if strategy == 'abortSlowConsumer' and (max_count >= 0 or max_duration >= 0) then
  -- §8.2. The strategy hears of a consumer when it is marked slow: here dispatch's slow flag (§8.1, set
  -- when the queue tried to dispatch to it while it was full) stands for ActiveMQ's slowConsumer()
  -- callback. Each new flag (a changed slow_since) is one more callback. A pull consumer (prefetch 0)
  -- holds no window and is never slow. A consumer whose lease lapsed is left to the reaper.
  local function slow_now(c)
    return c.alive and c.slow and c.prefetch > 0 and consumers.is_full(c)
  end
  for _, c in ipairs(cons) do
    if slow_now(c) then
      local e = tracked[c.id]
      if not e then
        track(c, 0, 'full while the queue had a message for it')
      else
        local since = redis.call('HGET', base.K_C(c.id), 'slow_since') or ''
        if since ~= e[3] and max_count > 0 then e[2] = e[2] + 1 end
        e[3] = since
      end
    end
  end
  mark_all()
  for _, c in ipairs(cons) do
    local e = tracked[c.id]
    if e then
      if not slow_now(c) then
        tracked[c.id] = nil
      elseif qualifies(e) then
        to_abort[#to_abort + 1] = {c.id, why(e, '')}
      end
    end
  end
elseif strategy == 'abortSlowAckConsumer' and max_since_ack >= 0 then
  -- §8.3: every period, a consumer holding messages (or any, without ignoreIdleConsumers) that has not
  -- acknowledged for longer than maxTimeSinceLastAck is slow; a consumer's first ack time is its creation.
  mark_all()
  for _, c in ipairs(cons) do
    if not c.alive then
      tracked[c.id] = nil
    elseif ignore_idle and c.n == 0 then
      tracked[c.id] = nil
    else
      local times = redis.call('HMGET', base.K_C(c.id), 'last_ack', 'added')
      local since_ack = base.NOW - (tonumber(times[1]) or tonumber(times[2]) or base.NOW)
      if since_ack > max_since_ack then
        local e = tracked[c.id]
        if not e then
          track(c, 1, 'no acknowledgement for ' .. ms(since_ack) .. ' ms')
        elseif max_count > 0 then
          e[2] = e[2] + 1
        end
        e = tracked[c.id]
        if qualifies(e) then
          local detail = 'no acknowledgement for ' .. ms(since_ack) .. ' ms (maxTimeSinceLastAck '
                         .. ms(max_since_ack) .. ' ms), '
          to_abort[#to_abort + 1] = {c.id, why(e, detail)}
        end
      else
        tracked[c.id] = nil
      end
    end
  end
else
  tracked = {}
end

local aborted = {}
for _, item in ipairs(to_abort) do
  abort(item[1], item[2], abort_connection, strategy)
  tracked[item[1]] = nil
  aborted[#aborted + 1] = item[1]
end

redis.call('DEL', K_SLOW)
local count = 0
for cid, e in pairs(tracked) do
  redis.call('HSET', K_SLOW, cid, cmsgpack.pack(e))
  count = count + 1
end
if count > 0 then redis.call('PEXPIRE', K_SLOW, KEEP_MS) end
return finish(1, count, aborted)
