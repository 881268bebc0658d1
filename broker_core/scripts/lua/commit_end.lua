-- The last call of a transaction's commit, after its steps (ops/transactions.py commit; a step runs only
-- while no step before it was refused: includes/base.lua begin_call). KEYS[1] = the transaction's key.
-- Every step applied: the transaction ends (its key deleted), 1. A step was refused, so none applied: the
-- refusal key goes, the transaction stays as it was (its owner may commit it again or roll it back), and
-- the reply is the error NOT_COMMITTED. A transaction no longer open (expired, ended): NO_TRANSACTION.
-- (no includes: the transaction's key is not a destination's prefix, which base.begin_call sets up)
--@allow-oom
local tx = KEYS[1]
local refused = tx .. ':refused'  -- (includes/base.lua base.refusal_key)
if redis.call('EXISTS', tx) == 0 then
  redis.call('DEL', refused)
  return redis.error_reply('NO_TRANSACTION no open transaction ' .. tx)
end
if redis.call('DEL', refused) == 1 then
  return redis.error_reply('NOT_COMMITTED a step was refused; nothing was applied')
end
redis.call('DEL', tx)
return 1
