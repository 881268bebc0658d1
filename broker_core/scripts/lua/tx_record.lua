-- Records added to an open transaction with its new tally (ops/transactions.py _record), if its tally is
-- still the one they were checked against: the limits' check is Python's (TransactionLimits), and this
-- makes it hold against another caller adding to the same transaction meanwhile.
-- KEYS[1] = the transaction's key (a list: its tally record first, then its send and ack records).
-- ARGV[1] = the tally as read, ARGV[2] = the new tally, ARGV[3..] = the records.
-- 1: added. 0: the tally changed meanwhile, nothing added (read it again). -1: no open transaction (it
-- ended, or expired, since it was read): nothing added, and no key made without a lifetime.
-- (no includes: the transaction's key is not a destination's prefix)
local tx = KEYS[1]
local tally = redis.call('LINDEX', tx, 0)
if not tally then
  return -1
end
if tally ~= ARGV[1] then
  return 0
end
redis.call('LSET', tx, 0, ARGV[2])
redis.call('RPUSH', tx, unpack(ARGV, 3))
return 1
