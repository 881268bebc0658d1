-- Enqueue messages on a queue, then run a dispatch chunk.
-- ARGV: now, budget, then per message: id, packed message.
-- Returns {accepted ids..., '', dispatched, more, hold_until}; an id already stored is refused ('!' .. id),
-- an already expired message is not enqueued ('~' .. id).
--@include base
--@include dispatch
NOW = tonumber(ARGV[1])
local missing = require_destination()
if missing then return missing end
local limit = policy_num('maxMessageSize')
for i = 4, #ARGV, 2 do
  if limit > 0 and #ARGV[i] > limit then
    return fail('MESSAGE_TOO_LARGE', 'message ' .. ARGV[i - 1] .. ' is ' .. #ARGV[i] ..
      ' bytes packed, over the destination limit maxMessageSize=' .. limit)
  end
end
local out = {}
for i = 3, #ARGV, 2 do
  local id, blob = ARGV[i], ARGV[i + 1]
  if redis.call('HEXISTS', K_MSGS, id) == 1 or redis.call('HEXISTS', K_INFLIGHT, id) == 1 then
    meta_incr('duplicates')
    out[#out + 1] = '!' .. id
  else
    local m = unpack_message(blob)
    if is_expired(m) then
      -- Expired on arrival: never stored nor counted as an enqueue (Queue.send).
      meta_incr('expired_on_arrival')
      emit('expire', 'msg', id, 'expiration', tonumber(m[M_EXPIRATION]) or 0, 'on_arrival', 1)
      out[#out + 1] = '~' .. id
    else
      local seq = meta_incr('seq')
      redis.call('HSET', K_MSGS, id, blob)
      pending_add(id, pending_score(seq, m[M_PRIORITY]))
      meta_incr('enqueued')
      emit('enqueue', 'msg', id, 'priority', m[M_PRIORITY] or 4, 'group', m[M_GROUP] or '', 'size', #blob)
      out[#out + 1] = id
    end
  end
end
local dispatched, more, hold = dispatch_chunk(tonumber(ARGV[2]))
out[#out + 1] = ''
out[#out + 1] = dispatched
out[#out + 1] = more
out[#out + 1] = hold
return out
