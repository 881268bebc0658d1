-- Renew consumer leases. ARGV: now, lease ms, consumer ids... Returns the ids that are not registered.
--@include base
NOW = tonumber(ARGV[1])
local missing = {}
for i = 3, #ARGV do
  if redis.call('ZADD', K_LEASES, 'XX', 'CH', NOW + tonumber(ARGV[2]), ARGV[i]) == 0
     and redis.call('ZSCORE', K_LEASES, ARGV[i]) == false then
    missing[#missing + 1] = ARGV[i]
  end
end
return missing
