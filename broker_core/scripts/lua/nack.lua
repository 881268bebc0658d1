-- Negative acknowledgement (spec §5.3, Appendix A), redelivery done by the broker with ActiveMQ's
-- RedeliveryPolicy numbers. ARGV: now, budget, consumer id, poison ('1'/'0'), jitter (-1..1, for
-- collision avoidance), message ids...
-- Each message's redelivery counter goes up. Poison, or a counter past maximumRedeliveries (-1 =
-- unlimited), dead-letters it now (a non-durable topic subscription drops it); otherwise it is parked
-- until its redelivery delay has passed (other messages keep flowing) and then goes ahead of fresh
-- messages.
-- Returns {dead-lettered count, redelivered count, the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local cid, poison, jitter = ARGV[3], ARGV[4] == '1', tonumber(ARGV[5])
local c = consumers.find(cid)
if not c then return base.fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination') end
local ids, seen = {}, {}
for i = 6, #ARGV do
  if not redis.call('ZSCORE', base.K_CINF(cid), ARGV[i]) then
    return base.fail('NOT_IN_FLIGHT', 'message ' .. ARGV[i] .. ' is not in flight with consumer ' .. cid)
  end
  if not seen[ARGV[i]] then ids[#ids + 1] = ARGV[i] end
  seen[ARGV[i]] = true
end
if #ids == 0 then return base.fail('INVALID_ACK', 'no message id given') end

-- The first redelivery waits initialRedeliveryDelay; each later one RedeliveryPolicy's
-- getNextRedeliveryDelay(previous): redeliveryDelay, or with exponential back-off (and a previous delay
-- above 0, a multiplier above 1) previous x backOffMultiplier, over maximumRedeliveryDelay (-1 = none)
-- cut back to max(maximumRedeliveryDelay, redeliveryDelay).
local function delay_for(count)
  local p = base.policy()
  local step, backoff = tonumber(p['redeliveryDelay']), p['useExponentialBackOff'] == '1'
  local multiplier, cap = tonumber(p['backOffMultiplier']), tonumber(p['maximumRedeliveryDelay'])
  local delay = tonumber(p['initialRedeliveryDelay'])
  for _ = 2, math.min(count, 64) do
    local next_delay = step
    if delay > 0 and backoff and multiplier > 1 then
      next_delay = delay * multiplier
      if cap ~= -1 and next_delay > cap then next_delay = math.max(cap, step) end
    end
    delay = next_delay
  end
  -- (the variance is getNextRedeliveryDelay's: ActiveMQMessageConsumer.rollback takes the initial delay as
  -- it is; a back-off's chain is computed from unvaried delays, where the client's multiplies the varied one)
  if count > 1 and p['useCollisionAvoidance'] == '1' then delay = delay + delay * 0.15 * jitter end
  return math.floor(delay)
end

local max = base.policy_num('maximumRedeliveries')
local rcv = outbox.received_upto(cid)
-- A non-durable topic subscription's poison ack only counts the message (TopicSubscription.acknowledge):
-- ActiveMQ dead-letters nothing for it, whether a STOMP NACK or a redelivery limit sent the ack.
local dead_letters = not (base.SUB and redis.call('HGET', base.K_META, 'durable') ~= '1')
local dead, later = 0, 0
for _, id in ipairs(ids) do
  if tonumber(redis.call('ZSCORE', base.K_CINF(cid), id)) > rcv then redis.call('LREM', base.K_COUT(cid), 1, id) end
  local score = lifecycle.take_inflight(cid, id)
  local count = redis.call('HINCRBY', base.K_REDELIV, id, 1)
  if c.prefetch > 0 and c.ext > 0 then c.ext = redis.call('HINCRBY', base.K_C(cid), 'ext', -1) end
  if poison or (max >= 0 and count > max) then
    local blob = redis.call('HGET', base.K_MSGS, id)
    local m = message.unpack(blob)
    lifecycle.drop_message(id)
    base.meta_incr('dequeued')
    if not dead_letters then  -- (counted as the subscription's other drops are: includes/topic.lua)
      base.meta_incr('dropped')
      base.emit('drop', 'msg', id, 'cause', poison and 'poison' or 'redelivery')
    elseif poison then
      forward.dead_letter(id, m, blob, 'poison')
    else
      forward.dead_letter(id, m, blob, 'redelivery', count)
    end
    dead = dead + 1
  else
    local delay = delay_for(count)
    base.emit('redeliver', 'msg', id, 'consumer', cid, 'redeliveries', count, 'delay', delay)
    base.meta_incr('redelivered')
    if delay > 0 then
      lifecycle.park(id, base.NOW + delay, message.redelivery_score(score))
    else
      message.pending_add(id, message.redelivery_score(score))
    end
    later = later + 1
  end
end
-- back to the queue (or subscription), no longer a transaction's (a transacted ack's mark goes with the
-- window it was made in, as at a return: includes/lifecycle.lua txacks_key); left, the next consumer's close
-- would hold it for that transaction, whose commit would consume what that consumer never acknowledged
base.call_many('HDEL', lifecycle.txacks_key(), ids)
redis.call('HSET', base.K_C(cid), 'last_ack', base.NOW)  -- a negative ack is an ack for lastAckTime
message.room_freed(cid)
local dispatched, more, hold = dispatch.chunk(tonumber(ARGV[2]))
return dispatch.add_tail({ dead, later, nil, nil, nil }, dispatched, more, hold)
