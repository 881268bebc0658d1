-- Bookkeeping of the maintenance jobs (broker_core/maintenance.py): one lease per job and destination,
-- and the probe that tells the recovery job whether a destination has anything for it.
--
-- A lease is the key <prefix>:lease:<job> holding "<token>|<expires ms>". It is judged by the caller's
-- clock, like everything else here; the key's own PX expiry (same length, Redis's clock) only makes sure
-- a lease nobody looks at again goes away.
-- KEYS[1] = the destination's prefix. ARGV: now, op, then per op:
--   acquire job token ttl  -> 1 if the caller holds the lease now (taken, or renewed: same token), else 0
--   release job token      -> 1 if the caller held it (and it is gone now), else 0
--   recover token ttl grace -> {held, lapsed consumers, forwards waiting, next dispatch time (0 = none),
--                             closed consumers whose messages are still owed and ended subscriptions
--                             whose messages are still to release (a closer died between chunks:
--                             includes/lifecycle.lua return_owed), messages held for a transaction
--                             due to be looked at (return_lapsed), a topic's unfinished
--                             fan-outs (a sender died: includes/fanout.lua) and a subscription's
--                             unfinished retroactive catch-up (includes/topic.lua catch_up)};
--                             takes the 'recover' lease only when there is something to do. Forwards
--                             count only once they have waited `grace` ms: until then the process that
--                             queued them is taken to be delivering them.
--   visit token ttl grace sweep_period slow_period offline_schedule keep_ms
--                          -> {held, lapsed, forwards, next dispatch time, sweep due (2: done here),
--                             slow check due, offline cleanup due, scheduled}: the tick's visit of this
--                             prefix's entries in the maintenance index (<ns>:due, <ns>:due:periodic).
--                             The recover probe, and whether each periodic job is due (period 0 / -1 =
--                             off). A sweep that is due on a queue or subscription with nothing pending
--                             is done here (it would examine nothing). When nothing is left for the
--                             caller to do, the entries are set to when something is next due here
--                             (scheduled = 1); else the caller does the work and then calls `schedule`.
--                             The first visit of a prefix also counts its scheduled jobs afresh
--                             (recount_scheduled).
--   schedule grace sweep_period slow_period offline_schedule -> {next due, next periodic} (0: no entry)
--@include base
--@allow-oom
base.NOW = tonumber(ARGV[1])
local op = ARGV[2]

local function lease_key(job) return base.P .. ':lease:' .. job end

local function acquire(job, token, ttl)
  local key = lease_key(job)
  local held = redis.call('GET', key)
  if held then
    local owner, expires = string.match(held, '^(.*)|(%d+)$')
    if owner ~= token and (tonumber(expires) or 0) > base.NOW then return 0 end
  end
  redis.call('SET', key, token .. '|' .. string.format('%d', base.NOW + ttl), 'PX', ttl)
  return 1
end

local DUE_KEY = string.match(base.P, '^(.-):{') .. ':due'
local NEXT_TICK_MS = 1000  -- Celery beat's period (signalbox/celery.py)

-- Whether the recovery job has work here, taking its lease when it has (op `recover`).
local function probe(token, ttl, grace)
  local lapsed = redis.call('ZCOUNT', base.K_LEASES, '-inf', '(' .. base.NOW)
  local forwards = redis.call('HLEN', base.K_FWD)
  local stale = false
  if forwards == 0 then
    redis.call('HDEL', base.P .. ':maint', 'recover:fwd_since')
  else
    local since = tonumber(redis.call('HGET', base.P .. ':maint', 'recover:fwd_since') or '')
    if not since then
      redis.call('HSET', base.P .. ':maint', 'recover:fwd_since', string.format('%d', base.NOW))
    else
      stale = base.NOW - since >= grace
    end
  end
  -- Dispatch must run again when a parked message (redelivery delay, scheduled delivery) comes due or a
  -- delayed start ends; every other script runs dispatch itself.
  local due = 0
  local first = redis.call('ZRANGE', base.K_PARKED, 0, 0, 'WITHSCORES')
  if #first > 0 then due = tonumber(first[2]) end
  local hold = base.tonum(redis.call('HGET', base.K_META, 'hold_until'), 0)
  if hold > 0 and (due == 0 or hold < due) then due = hold end
  local owed = redis.call('HLEN', base.P .. ':closing') + redis.call('SCARD', base.TP .. ':ended')
  if not base.SUB then
    owed = owed + redis.call('LLEN', base.TP .. ':fanout')  -- includes/fanout.lua
  else
    owed = owed + redis.call('HEXISTS', base.K_META, 'catchup')  -- a retroactive catch-up: topic.lua catch_up
  end
  -- messages held for a transaction due to be looked at (includes/lifecycle.lua return_lapsed)
  owed = owed + redis.call('ZCOUNT', base.P .. ':txheld', '-inf', base.NOW)
  local held = 0
  if lapsed > 0 or stale or owed > 0 or (due > 0 and due <= base.NOW) then
    held = acquire('recover', token, ttl)
  end
  if not stale then forwards = 0 end
  return {held, lapsed, forwards, due, owed}
end

-- When the tick must next look at this prefix, in two entries: in <ns>:due the first lease to lapse,
-- parked message or delayed start to come due, forward to go stale (on the topic's own entry, where
-- forwards wait) -- work with a deadline, which every tick does first; in <ns>:due:periodic the next
-- expiry sweep, slow-consumer check or offline-durable cleanup. No entry when nothing of its kind is
-- coming. Scripts that add work only bring the first entry forward (base.lua due_at), so a value read and
-- written here in one step is never later than the work. Work still due after a visit (another worker
-- holds the job, more than one visit's worth) is left for the next tick, a second on.
local function schedule(grace, sweep, slow, offline)
  local at, later = false, false
  local function soon(t) if t and (not at or t < at) then at = t end end
  local function periodic(t) if not later or t < later then later = t end end
  local first = redis.call('ZRANGE', base.K_LEASES, 0, 0, 'WITHSCORES')
  if #first > 0 then soon(tonumber(first[2]) + 1) end  -- a lease lapses once its end is in the past
  first = redis.call('ZRANGE', base.P .. ':browsers', 0, 0, 'WITHSCORES')  -- (a browser's: the visit removes it)
  if #first > 0 then soon(tonumber(first[2]) + 1) end
  first = redis.call('ZRANGE', base.K_PARKED, 0, 0, 'WITHSCORES')
  if #first > 0 then soon(tonumber(first[2])) end
  local hold = base.tonum(redis.call('HGET', base.K_META, 'hold_until'), 0)
  if hold > 0 then soon(hold) end
  -- a message held for a transaction: when its transaction is next looked at (it may have lapsed)
  first = redis.call('ZRANGE', base.P .. ':txheld', 0, 0, 'WITHSCORES')
  if #first > 0 then soon(tonumber(first[2])) end
  -- returns a closed consumer still owes, or what an ended subscription held: the closer drives them, and
  -- the next tick finishes them if it died
  if redis.call('HLEN', base.P .. ':closing') + redis.call('SCARD', base.TP .. ':ended') > 0 then soon(base.NOW) end
  -- a new retroactive durable subscription's catch-up (includes/topic.lua catch_up), the same way
  if base.SUB and redis.call('HEXISTS', base.K_META, 'catchup') == 1 then soon(base.NOW) end
  local maint = redis.call('HMGET', base.P .. ':maint', 'recover:fwd_since', 'expire:started', 'expire:running',
                           'slow:last_run', 'offline:last_run')
  if not base.SUB and redis.call('HLEN', base.K_FWD) > 0 then soon((tonumber(maint[1] or '') or base.NOW) + grace) end
  if sweep > 0 then
    if maint[3] == '1' then periodic(base.NOW) else periodic((tonumber(maint[2] or '') or base.NOW) + sweep) end
  end
  if slow >= 0 then periodic((tonumber(maint[4] or '') or base.NOW) + slow) end
  if offline >= 0 then periodic((tonumber(maint[5] or '') or base.NOW) + offline) end
  local function put(key, t)
    if not t then return redis.call('ZREM', key, base.P) end
    if t <= base.NOW then t = base.NOW + NEXT_TICK_MS end
    redis.call('ZADD', key, string.format('%d', t), base.P)
  end
  put(DUE_KEY, at)
  put(DUE_KEY .. ':periodic', later)
  return {at or 0, later or 0}
end

-- The meta's 'scheduled' (includes/lifecycle.lua parked_info) counted afresh, once per destination: entries
-- parked before the count was kept are not in it, and a repeating job's entry never leaves (each firing
-- parks it again under its id), so it read low for as long as such a job ran. Bounded: a parkinfo of at
-- most RECOUNT_MOST entries is counted in this call (HVALS, well under a millisecond); a larger one keeps
-- its count as it is. 'scheduled_counted' in the meta marks it done (a destination made again counts again).
local RECOUNT_MOST = 2000
local function recount_scheduled()
  if redis.call('HEXISTS', base.K_META, 'scheduled_counted') == 1
     or redis.call('HLEN', base.K_PARKINFO) > RECOUNT_MOST then
    return
  end
  local n = 0
  for _, info in ipairs(redis.call('HVALS', base.K_PARKINFO)) do
    if info == 'job' or string.byte(info) == 115 then n = n + 1 end  -- (lifecycle.unparked's test)
  end
  redis.call('HSET', base.K_META, 'scheduled', n, 'scheduled_counted', 1)
end

if op == 'acquire' then
  return acquire(ARGV[3], ARGV[4], tonumber(ARGV[5]))
elseif op == 'release' then
  local key = lease_key(ARGV[3])
  local held = redis.call('GET', key)
  if held and string.match(held, '^(.*)|') == ARGV[4] then
    redis.call('DEL', key)
    return 1
  end
  return 0
elseif op == 'recover' then
  return probe(ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]))
elseif op == 'visit' then
  if redis.call('EXISTS', base.K_META) == 0 then  -- deleted (or a subscription that ended): out of the index
    redis.call('ZREM', DUE_KEY, base.P)
    redis.call('ZREM', DUE_KEY .. ':periodic', base.P)
    return {0, 0, 0, 0, 0, 0, 0, 0, 1}
  end
  recount_scheduled()
  base.prune_browsers()  -- browsers of gateways that died (a bounded part; the schedule brings the rest)
  local grace, sweep, slow, offline = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  local reply = probe(ARGV[3], tonumber(ARGV[4]), grace)
  local maint = redis.call('HMGET', base.P .. ':maint', 'expire:started', 'expire:running', 'slow:last_run',
                           'offline:last_run')
  local sweep_due = sweep > 0 and (maint[2] == '1' or not maint[1] or base.NOW >= tonumber(maint[1]) + sweep)
  if sweep_due and maint[2] ~= '1' and redis.call('ZCARD', base.K_PENDING) == 0 then
    -- a sweep of nothing: recorded as done now (maintenance.run_expiry_sweep's fields), no worker needed
    local now = string.format('%d', base.NOW)
    redis.call('HSET', base.P .. ':maint', 'expire:started', now, 'expire:running', 0, 'expire:examined', 0,
               'expire:expired', 0, 'expire:pages', 0, 'expire:last_run', now, 'expire:last_done', now,
               'expire:last_examined', 0, 'expire:last_expired', 0)
    redis.call('PEXPIRE', base.P .. ':maint', tonumber(ARGV[9]))
    sweep_due = 'done'
  end
  local slow_due = slow >= 0 and (not maint[3] or base.NOW >= tonumber(maint[3]) + slow)
  local offline_due = offline >= 0 and (not maint[4] or base.NOW >= tonumber(maint[4]) + offline)
  local scheduled = 0
  if reply[1] == 0 and sweep_due ~= true and not slow_due and not offline_due then
    schedule(grace, sweep, slow, offline)
    scheduled = 1
  end
  reply[6] = (sweep_due == 'done' and 2) or (sweep_due and 1) or 0
  reply[7], reply[8], reply[9] = slow_due and 1 or 0, offline_due and 1 or 0, scheduled
  return reply
elseif op == 'schedule' then
  if redis.call('EXISTS', base.K_META) == 0 then
    redis.call('ZREM', DUE_KEY, base.P)
    redis.call('ZREM', DUE_KEY .. ':periodic', base.P)
    return {0, 0}
  end
  return schedule(tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]))
end
return redis.error_reply('INVALID_OPERATION unknown maintenance operation ' .. tostring(op))
