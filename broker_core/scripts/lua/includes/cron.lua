-- AMQ_SCHEDULED_CRON: the next time a cron job fires, from the compact form broker_core/cron.py makes at the
-- send ([expression, minute bits (0-59), hour bits (0-23), day bits (1-31), month bits (1-12), weekday bits
-- (0-6, 0 Sunday), 1 when a day in either day field matches]; each bit string is '0'/'1' per value). Redis's
-- Lua has no os.date: the calendar is computed here, in UTC (days from 1970-01-01 to a date and back, Howard
-- Hinnant's algorithms). Its module table is `cron`; nothing here calls Redis.
local cron = {}

-- How many days ahead a search looks at most: a date cron.py accepts comes within 8 years (the 29th of
-- February, across a century year that is not a leap year: 2096 to 2104), so this is never reached; it
-- bounds the loop below whatever the form (a turn per day at most: 3,294).
cron.MAX_DAYS = 9 * 366

-- (math and string are read inside the functions: a function library's top level runs where they are not)
cron.MONTH_DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }

function cron.month_days(y, m)
  if m == 2 and ((y % 4 == 0 and y % 100 ~= 0) or y % 400 == 0) then return 29 end
  return cron.MONTH_DAYS[m]
end

-- Days since 1970-01-01 -> year, month (1-12), day (1-31).
function cron.civil(days)
  local floor = math.floor
  local z = days + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local d = doy - floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m, d
end

-- Year, month (1-12), day (1-31) -> days since 1970-01-01.
function cron.days(y, m, d)
  local floor = math.floor
  if m <= 2 then y = y - 1 end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = floor((153 * mp + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy - 719468
end

-- The first minute strictly after `after` (ms since the epoch) that the form matches, in ms; nil if none
-- within cron.MAX_DAYS. Walks from date to date: a month not in the form to the next one that is, a day
-- to the next one that may match (the next in the day-of-month field when that field alone decides, else
-- the next day: a weekday in the field comes within 7); on a matching day the hour and minute come from
-- the bit strings (string.find of the next '1'). The 29th of February 2104 from March 2096 is about 40
-- turns.
function cron.next(form, after)
  local floor, byte, find = math.floor, string.byte, string.find
  local minutes, hours, days, months, weekdays = form[2], form[3], form[4], form[5], form[6]
  local either = tonumber(form[7]) == 1
  local only_days = not either and weekdays == '1111111'
  local first_minute = find(minutes, '1', 1, true) - 1
  local t = floor(after / 60000) + 1  -- (minutes since the epoch)
  local day = floor(t / 1440)
  local minute = t - day * 1440  -- of the day; 0 once the walk has left the first day
  local last = day + cron.MAX_DAYS
  local y, m, d = cron.civil(day)
  while day <= last do
    if byte(months, m) ~= 49 then
      local later = find(months, '1', m + 1, true)
      if later then m = later else m, y = find(months, '1', 1, true), y + 1 end
      d, minute = 1, 0
      day = cron.days(y, m, 1)
    else
      local in_month = byte(days, d) == 49
      local in_week = byte(weekdays, (day + 4) % 7 + 1) == 49  -- (1970-01-01 was a Thursday)
      if (either and (in_month or in_week)) or (not either and in_month and in_week) then
        local h = floor(minute / 60)
        if byte(hours, h + 1) == 49 then
          local next_minute = find(minutes, '1', minute - h * 60 + 1, true)
          if next_minute then return ((day * 24 + h) * 60 + next_minute - 1) * 60000 end
        end
        local next_hour = find(hours, '1', h + 2, true)
        if next_hour then return ((day * 24 + next_hour - 1) * 60 + first_minute) * 60000 end
      end
      local to = d + 1
      if only_days then to = find(days, '1', d + 1, true) or 32 end
      if to > cron.month_days(y, m) then
        m = m + 1
        if m > 12 then m, y = 1, y + 1 end
        to, day = 1, cron.days(y, m, 1)
      else
        day = day + to - d
      end
      d, minute = to, 0
    end
  end
  return nil
end
