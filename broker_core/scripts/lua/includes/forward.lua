-- Messages leaving for another destination (dead-letter queue now; moves and copies later).
--
-- Another destination lives under another hash tag, so one script cannot write both. The message is
-- taken out of this destination and put in its forwarding hash in the same step; the caller then
-- delivers it to the target (ops/forward.py) and deletes the entry. The target drops an id
-- it has already enqueued, so a delivery repeated after a crash is harmless.

-- Its module table `forward`: n, the forwards this call recorded (virtual.lua's copies too); work_start,
-- selector.bytes when the call began.
local forward = { n = 0, work_start = 0, work_spent = false, with_flag = false, record = false,
                  dead_letter = false }
--@on-call
forward.n, forward.work_start = 0, selector.bytes
--@on-call-end
-- Has this call's selector work (selector.lua selector.bytes) reached a call's worth? Checked before an
-- evaluation, so a call does at most one more. Loops over any number of selectors in one send stop there:
-- a topic's fan-out goes on in the next call (fanout.lua); a routing check answers "take a copy".
function forward.work_spent()
  return selector.bytes - forward.work_start >= selector.call_limit
end

-- The flags a script returns (includes/dispatch.lua) say 2 when forwards wait for the caller.
function forward.with_flag(flags)
  if forward.n > 0 or advisory.n > 0 then return bit.bor(flags, 2) end  -- includes/advisory.lua
  return flags
end

-- Record a forward: target uri, why (cause kind and argument) and the packed message. A message that
-- leaves is forgotten by this destination's duplicate audit, so it may come back (retry from a DLQ,
-- dead-lettered again) without being taken for a duplicate; ActiveMQ rolls back the DLQ audit likewise.
-- `field` (default: the id) names the record; a durable subscription's own dead-letter queue gets
-- '<id>|<target>', so that each subscription's dead letter of a message is delivered (operations.forward
-- reads the id before '|').
function forward.record(id, blob, target, cause, cause_arg, field)
  redis.call('HSET', base.K_FWD, field or id, cmsgpack.pack({ target, cause, cause_arg or '', blob }))
  base.due_at(base.TP, base.NOW)  -- the caller delivers it; should it die first, the tick finds it (base.lua)
  if cause ~= 'copy' then redis.call('ZREM', base.K_AUDIT, id) end
  forward.n = forward.n + 1
end

-- §5.4: send a message that left this destination for a reason to the dead-letter queue, or drop it
-- (discarding strategy, non-persistent without processNonPersistent, expired without processExpired
-- whatever the cause, or the dead-letter queue itself). `cause` is 'redelivery' (argument: the delivery count), 'poison'
-- (no cause text, STOMP NACK), 'expired' (argument: the expiration) or 'evicted' (a topic subscription's
-- discard; argument: its consumer id). Returns true if forwarded.
function forward.dead_letter(id, m, blob, cause, cause_arg)
  local target, field = base.policy()['deadLetterTarget'], nil
  if base.SUB then
    -- destinationPerDurableSubscriber (individual strategy, topics; operations._write_policy): a durable
    -- subscription's dead letters go to '<topicPrefix><topic>.<clientId>:<subscriptionName><topicSuffix>'
    -- (IndividualDeadLetterStrategy.createDestination with DurableTopicSubscription.getSubscriptionKey)
    local per = redis.call('HMGET', base.K_POLICY, 'deadLetterDurablePrefix', 'deadLetterDurableSuffix')
    if per[1] and per[1] ~= '' then
      local sub = redis.call('HMGET', base.K_META, 'durable', 'client', 'name')
      if sub[1] == '1' then
        target = per[1] .. sub[2] .. ':' .. sub[3] .. (per[2] or '')
        field = id .. '|' .. target
      end
    end
  end
  local persistent = m[message.PERSISTENT] == true or m[message.PERSISTENT] == 1
  local keep = target ~= '' and target ~= redis.call('HGET', base.K_META, 'uri')
  if keep and not persistent and not base.policy_flag('processNonPersistent') then keep = false end
  -- (isSendToDeadLetterQueue asks whether the message is expired, whatever the cause: a non-durable topic
  -- subscription's discard of one that expired while pending is refused too; 'expired' is kept for an
  -- EXPIRED ack, which the client may send before the broker's clock says so)
  if keep and (cause == 'expired' or message.is_expired(m)) and not base.policy_flag('processExpired') then
    keep = false
  end
  if keep then
    forward.record(id, blob, target, cause, cause_arg, field)
    base.meta_incr('deadlettered')
    -- the MessageDLQd advisory carries a copy
    base.emit_message(blob, 'deadletter', 'msg', id, 'target', target, 'cause', cause, 'detail', cause_arg or '')
  else
    base.meta_incr('discarded')
    base.emit('discard', 'msg', id, 'cause', cause, 'detail', cause_arg or '')
  end
  return keep
end
