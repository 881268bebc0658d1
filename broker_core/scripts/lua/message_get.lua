-- One message with where it is (QueueView.getMessage). ARGV: now, message id.
-- Returns {packed message, state, consumer, redeliveries} or an empty table.
--@include base
--@include dispatch
--@allow-oom
base.NOW = tonumber(ARGV[1])
local unknown = base.unknown_destination()
if unknown then return unknown end
local where, cid = operator.locate(ARGV[2])
if not where and redis.call('ZSCORE', lifecycle.txheld_key(), ARGV[2]) then
  where, cid = 'inflight', ''  -- held for a transaction, its consumer closed (includes/lifecycle.lua)
end
local blob = redis.call('HGET', base.K_MSGS, ARGV[2])
if not blob and where == 'parked' then
  local job = redis.call('HGET', base.K_SCHED, ARGV[2])
  if job then blob = cmsgpack.unpack(job)[1] end
end
if not where or not blob then return {} end
return {blob, where, cid or '', tonumber(redis.call('HGET', base.K_REDELIV, ARGV[2])) or 0}
