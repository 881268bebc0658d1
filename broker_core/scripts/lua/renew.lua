-- Renew consumer leases. ARGV: now, lease ms, consumer ids... Returns the ids that are not registered.
--@include base
--@include message
--@allow-oom
base.NOW = tonumber(ARGV[1])
local missing = {}
for i = 3, #ARGV do
  if redis.call('ZSCORE', base.K_LEASES, ARGV[i]) then
    message.renew_lease(ARGV[i], tonumber(ARGV[2]))
  else
    missing[#missing + 1] = ARGV[i]
  end
end
return missing
