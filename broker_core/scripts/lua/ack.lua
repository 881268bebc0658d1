-- Acknowledge messages of one or more consumers of a destination (spec §5.1, Appendix A), then optionally
-- hand each of them its next messages.
-- ARGV: now, budget ('check': only check, change nothing; 'commit': a step of a transaction's commit, see
-- below), then per consumer: consumer id, mode, receive max (0 = none), how many ids, the ids...
--   individual: exactly the listed messages (INDIVIDUAL ack; also STOMP client-individual);
--   cumulative: every message dispatched to this consumer up to and including the (single) listed one
--               (STANDARD ack of a CLIENT_ACKNOWLEDGE session; STOMP client mode);
--   delivered:  the listed messages reached the application; the prefetch window grows by their count
--               (a rollback that leaves them delivered shrinks it back: release.lua's keep).
-- Several consumers are the acks of concurrent callers (AsyncBroker, broker_core/drivers/coalesce.py), each consumer
-- named once. Nothing changes unless every listed message is in flight with its consumer: all of them are
-- checked before any is acknowledged. One dispatch chunk runs after all the acks.
-- 'commit': the commit's MULTI/EXEC checked every one of its acks ('check') before its first step applied
-- (ops/transactions.py commit), so a listed message no longer in flight was acknowledged by an earlier
-- step of the same commit (the transaction named it twice, or a cumulative ack covered it): it is skipped,
-- not refused, and the commit stays whole.
-- Returns {per consumer: acked count, messages received, and the received messages as receive.lua returns
-- them, then the tail (includes/dispatch.lua dispatch.add_tail)}.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local committing = ARGV[2] == 'commit'
local NONE = {}  -- (no held messages: the usual case, no table made per consumer)
local groups = { nil }  -- (made with room for one consumer, the usual call)
local at = 3
while at <= #ARGV do
  local cid, mode, receive_max, count = ARGV[at], ARGV[at + 1], base.number(ARGV[at + 2]), base.number(ARGV[at + 3])
  local first, last = at + 4, at + 3 + (count or 0)
  if not receive_max or not count or last > #ARGV then
    return base.fail('INVALID_ACK', 'malformed arguments for consumer ' .. tostring(cid))
  end
  for g = 1, #groups do
    if groups[g].cid == cid then
      return base.fail('INVALID_ACK', 'consumer ' .. cid .. ' named twice in one call')
    end
  end
  -- a transacted individual ack (mode 'tx:<tx key>'): a DELIVERED ack that also marks its messages as the
  -- transaction's, so that a close of their consumer holds them for it (includes/lifecycle.lua txacks_key)
  local mark = false
  if string.byte(mode) == 116 then  -- ('t': no other mode starts so; a pattern match costs every ack)
    mark, mode = string.sub(mode, 4), 'delivered'
  end
  local c = consumers.find(cid)
  -- a step of a commit may acknowledge messages held for its transaction, their consumer closed since
  local held_ok = base.STEP_OF and mode == 'individual'
  if not c and not held_ok then
    return base.fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination')
  end
  if count < 1 then return base.fail('INVALID_ACK', 'no message id given') end
  local seqs = { [ARGV[first]] = false }  -- (made with room for the first id: set just below)
  local others = nil  -- ids not in the consumer's window
  for i = first, last do
    local seq = c and redis.call('ZSCORE', base.K_CINF(cid), ARGV[i])
    if seq then
      seqs[ARGV[i]] = base.number(seq)
    elseif held_ok then
      others = others or {}
      others[#others + 1] = ARGV[i]
    elseif not committing then
      return base.fail('NOT_IN_FLIGHT', 'message ' .. ARGV[i] .. ' is not in flight with consumer ' .. cid)
    end
  end
  local held = NONE
  if others then
    held = lifecycle.held_for(base.STEP_OF, others)
    -- (committing: acknowledged by an earlier step. A durable subscription's consumer gone: the others
    -- are not this subscription's to acknowledge for the transaction, skipped: it was re-created under its
    -- name since, the ack's messages removed with the old one, or a NACK gave them back to it; an operator
    -- removes no subscription's message, so none left that way, as a queue's may, refused below)
    if #held < #others and not committing and (c or not base.SUB) then
      if not c then return base.fail('UNKNOWN_CONSUMER', 'no consumer ' .. cid .. ' on this destination') end
      local known = {}
      for i = 1, #held do known[held[i]] = true end
      for i = 1, #others do
        if not known[others[i]] then
          return base.fail('NOT_IN_FLIGHT', 'message ' .. others[i] .. ' is not in flight with consumer ' .. cid)
        end
      end
    end
    if #held > 1 then  -- an id named twice: once
      local seen, once = {}, {}
      for i = 1, #held do
        if not seen[held[i]] then once[#once + 1] = held[i] end
        seen[held[i]] = true
      end
      held = once
    end
  end
  local ids
  local by_id = mode == 'individual' or mode == 'delivered'
  if by_id and count == 1 then
    ids = seqs[ARGV[first]] and { ARGV[first] } or {}  -- one id: nothing to dedupe (made at its size)
  elseif by_id then
    ids = {}
    local seen = {}
    for i = first, last do
      if not seen[ARGV[i]] and seqs[ARGV[i]] then ids[#ids + 1] = ARGV[i] end  -- an id named twice: once
      seen[ARGV[i]] = true
    end
  elseif mode == 'cumulative' then
    if count ~= 1 then return base.fail('INVALID_ACK', 'a cumulative ack names exactly one message') end
    -- at most CUMULATIVE_MOST (ops/homes.py) in one call: more is refused before any change, and the
    -- caller acknowledges the oldest ones first, in bounded calls (a window may hold 32,767)
    ids = seqs[ARGV[first]] and redis.call('ZRANGEBYSCORE', base.K_CINF(cid), '-inf', seqs[ARGV[first]],
                                           'LIMIT', 0, 1001) or {}
    if #ids > 1000 then
      return base.fail('ACK_TOO_LARGE', 'a cumulative ack of more than 1000 messages (consumer ' .. cid .. ')')
    end
  else
    return base.fail('INVALID_ACK', 'unknown ack mode ' .. mode .. ' (individual, cumulative or delivered)')
  end
  if mode == 'delivered' then
    for i = 1, #ids do
      if seqs[ids[i]] > c.rcv then  -- (c.rcv: outbox.received_upto(cid), read with the consumer)
        return base.fail('NOT_DELIVERED', 'message ' .. ids[i] .. ' has not been received by consumer ' .. cid)
      end
    end
  end
  if mark then  -- a message another open transaction acknowledged is that one's until it ends: refused, naming it
    local marks = base.call_many('HMGET', lifecycle.txacks_key(), ids)
    for i = 1, #ids do
      local other = marks[i]  -- (in flight: the key alone; held: the key, '|', its pending score)
      other = other and string.match(other, '^[^|]*')
      if other and other ~= mark and redis.call('EXISTS', other) == 1 then
        return base.fail('IN_TRANSACTION', 'message ' .. ids[i] .. ' is acknowledged in transaction '
                         .. (string.match(other, ':tx:([^:]*)$') or other) .. ' already: nothing was done (commit '
                         .. 'or roll that one back first)')
      end
    end
  end
  groups[#groups + 1] = { c = c, cid = cid, mode = mode, ids = ids, seqs = seqs, receive_max = receive_max,
                          held = held, mark = mark }
  at = last + 1
end
if #groups == 0 then return base.fail('INVALID_ACK', 'no consumer given') end
-- budget 'check': the checks only, nothing changed (a large ack is checked whole, then sent in parts)
if ARGV[2] == 'check' then return { 0, 0, 0 } end

local acks = { nil }  -- the acknowledged messages, {consumer, ids} per consumer (lifecycle.lua ack_messages)
for g = 1, #groups do
  local group = groups[g]
  local c, ids = group.c, group.ids
  if #group.held > 0 then lifecycle.consume_held(group.cid, group.held) end
  if not c then
    -- (a closed consumer: its held messages only)
  elseif group.mode == 'delivered' then
    c.kept = true  -- this script keeps `c` current (lifecycle.lua ack_messages)
    if group.mark and #ids > 0 then
      local marks = {}
      for i = 1, #ids do marks[2 * i - 1], marks[2 * i] = ids[i], group.mark end
      base.call_many('HSET', lifecycle.txacks_key(), marks)
      redis.call('HSET', base.K_META, 'txmarks', '1')  -- (from now on acks look for marks: count_acked)
    end
    if c.prefetch > 0 then c.ext = redis.call('HINCRBY', base.K_C(c.id), 'ext', #ids) end  -- `c` stays current
    redis.call('HSET', base.K_C(c.id), 'last_ack', base.NOW)  -- any ack is one (AbstractSubscription.acknowledge)
  else
    c.kept = true
    local seqs, rcv = group.seqs, c.rcv
    for i = 1, #ids do  -- (numeric loops in this path: ipairs is a call into C per element)
      -- acked before received
      if (seqs[ids[i]] or 0) > rcv then redis.call('LREM', base.K_COUT(c.id), 1, ids[i]) end
    end
    if #ids > 0 then acks[#acks + 1] = { c, ids } end
  end
end
if #acks > 0 then lifecycle.ack_messages(acks) end
for g = 1, #groups do if groups[g].c then message.room_freed(groups[g].c.id) end end
-- The consumers' tables are current (the acks kept them so): the dispatch chunk uses them rather than read
-- them again (consumers.lua), and keeps them current.
local known = {}
for g = 1, #groups do if groups[g].c then known[groups[g].c.id] = groups[g].c end end
local budget = committing and 0 or base.number(ARGV[2])
local dispatched, more, hold = dispatch.chunk(budget, known)
-- (room for one consumer's reply with one message: a table that grows is rebuilt at each power of two)
local out = { nil, nil, nil, nil, nil, nil, nil, nil, nil }
local refill = false  -- a message expired as it was handed over: its room is dispatched to below
for g = 1, #groups do
  local group = groups[g]
  local c = group.c
  out[#out + 1] = #group.ids + #group.held
  local count_at = #out + 1
  out[count_at] = 0
  if group.receive_max > 0 and c then
    -- (the dispatch chunk changes a pull consumer's (prefetch 0) window: read again)
    local _, freed = outbox.pop(c.prefetch > 0 and c or consumers.find(c.id), group.receive_max, out)
    refill = refill or freed
    out[count_at] = (#out - count_at) / 4  -- (4 values per message handed over: expired ones are not)
  end
end
if refill then
  local more_dispatched
  more_dispatched, more, hold = dispatch.chunk(budget)
  dispatched = dispatched + more_dispatched
end
dispatch.add_tail(out, dispatched, forward.with_flag(more), hold)  -- (handing over may have expired some)
return out
