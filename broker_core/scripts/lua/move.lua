-- Move or copy messages to another destination (QueueView.move/copy...To, retry from a DLQ), by id
-- (pending or parked) or every pending message a selector matches. The message leaves (move) or stays (copy) here in
-- the same step as it is queued for the target (includes/forward.lua); in-flight messages are not
-- moved. Bounded: examines at most ARGV[7] messages per call.
-- ARGV: now, budget, mode ('move', 'copy' or 'retry'), target uri ('' for retry: each message's
-- original destination), cursor (score; '' = head), examine budget, max to take, compiled selector
-- JSON or '', ids... (ids given: only those)
-- Returns {taken, next cursor ('' when done), the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
base.NOW = tonumber(ARGV[1])
local unknown = base.unknown_destination()
if unknown then return unknown end
local mode, target, cursor = ARGV[3], ARGV[4], ARGV[5]
local budget, max = tonumber(ARGV[6]), tonumber(ARGV[7])
local expr = false
if ARGV[8] ~= '' then expr = cjson.decode(ARGV[8]) end
if mode == 'retry' and redis.call('HGET', base.K_META, 'dlq') ~= '1' then
  return base.fail('NOT_A_DLQ', 'Retry of message is only possible on Dead Letter Queues! '
    .. redis.call('HGET', base.K_META, 'uri') .. ' is not one')
end
local self_uri = redis.call('HGET', base.K_META, 'uri')

-- Validate before changing anything: named messages exist here, outside any consumer's window.
local ids = {}
for i = 9, #ARGV do
  local where, cid = operator.locate(ARGV[i])
  if not where and redis.call('ZSCORE', lifecycle.txheld_key(), ARGV[i]) then  -- (includes/lifecycle.lua)
    return base.fail('IN_FLIGHT', 'message ' .. ARGV[i] .. ' is in flight, held for the transaction that '
      .. 'acknowledged it (its consumer closed); it can be moved once that transaction rolls back')
  end
  if not where then return base.fail('NO_MESSAGE', 'no message ' .. ARGV[i] .. ' on ' .. self_uri) end
  local score, scheduled = nil, false
  if where == 'parked' then
    score, scheduled = lifecycle.parked_score(redis.call('HGET', base.K_PARKINFO, ARGV[i]) or '')
  end
  if scheduled then  -- (not on the queue before its time, as in ActiveMQ, whose scheduler holds it)
    return base.fail('SCHEDULED_JOB', 'message ' .. ARGV[i] .. ' is a '
      .. (score == nil and 'repeating scheduled message' or 'scheduled message, not on the queue before its time')
      .. '; cancel it with remove instead of moving it')
  end
  if where == 'inflight' then
    return base.fail('IN_FLIGHT', 'message ' .. ARGV[i] .. ' is in flight with consumer ' .. cid ..
      '; it can be moved once acknowledged or returned')
  end
  if mode == 'retry' then
    local orig = message.unpack(redis.call('HGET', base.K_MSGS, ARGV[i]))[message.ORIG_DEST]
    if not orig or orig == '' then
      return base.fail('NO_ORIGINAL_DESTINATION', 'message ' .. ARGV[i] .. ' has no original destination')
    end
  end
  ids[#ids + 1] = ARGV[i]
end

local taken = 0
local function take(id, m, blob)
  local to = target
  if mode == 'retry' then
    to = m[message.ORIG_DEST]
    if not to or to == '' then return end  -- not retryable: stays (ids were checked above)
  end
  if mode == 'copy' then
    forward.record(id, blob, to, 'copy')
  else
    operator.take_out(id)
    forward.record(id, blob, to, mode)
    base.meta_incr('moved')
    base.meta_incr('dequeued')
  end
  base.emit(mode, 'msg', id, 'target', to)
  taken = taken + 1
end

local next_cursor = ''
if #ids > 0 then
  for _, id in ipairs(ids) do
    local blob = redis.call('HGET', base.K_MSGS, id)
    take(id, message.unpack(blob), blob)
  end
else
  local lower = cursor == '' and '-inf' or '(' .. cursor
  local batch = redis.call('ZRANGEBYSCORE', base.K_PENDING, lower, '+inf', 'WITHSCORES', 'LIMIT', 0, budget)
  -- (selector.lua selector.bytes: the call ends once its selector evaluations have done a call's worth)
  local selector_work, cut = selector.bytes, false
  for i = 1, #batch, 2 do
    if taken >= max then break end
    if i > 1 and selector.bytes - selector_work >= selector.call_limit then cut = true break end
    local id = batch[i]
    next_cursor = batch[i + 1]
    local blob = redis.call('HGET', base.K_MSGS, id)
    if blob then
      local m = message.unpack(blob)
      if not expr or selector.matches(expr, message.selector_view(id, m)) then take(id, m, blob) end
    end
  end
  if not cut and #batch / 2 < budget and taken < max then next_cursor = '' end
end
if mode ~= 'copy' then message.reset_pass() end
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ taken, next_cursor, nil, nil, nil }, dispatched, more, hold)
