-- Evaluate a compiled selector against one message: the console's "test this selector".
-- Keyless. ARGV[1] = Selector.compiled, ARGV[2] = JSON message (broker_core.selector.message_json).
-- Returns "TRUE", "FALSE" or "NULL"; a selector runtime error is an error reply "SELECTOR_ERROR <why>".

--@include selector
--@allow-oom

local expr = cjson.decode(ARGV[1])
local msg = cjson.decode(ARGV[2])
for k, v in pairs(msg) do
  if v == cjson.null then msg[k] = nil end
end

local ok, result = pcall(selector.eval, expr, msg)
if not ok then
  local why = selector.error_message(result)
  if why then return redis.error_reply('SELECTOR_ERROR ' .. why) end
  error(result, 0)
end
if result == true then return 'TRUE' end
if result == false then return 'FALSE' end
return 'NULL'
