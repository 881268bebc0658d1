-- JMS selector evaluation (spec §4.3) over the compiled form built by broker_core/selector.
--
-- The only selector evaluator in Signalbox: Python parses and type-checks, this file evaluates.
-- Its module table `selector` (its only top-level local; everything else stays inside selector.load, so
-- including scripts keep their local-variable budget) holds:
--   selector.eval(expr, msg)       -> true | false | nil (SQL NULL); raises on ActiveMQ's runtime errors
--   selector.matches(expr, msg)    -> true only when the result is exactly TRUE; never raises. A runtime
--                                     error counts as no match; its message is the second result.
--   selector.error_message(err)    -> the message of a selector runtime error caught by pcall, else nil
--   selector.bytes                 -> the work of every evaluation so far (bytes matched or built)
--   selector.call_limit            -> how much of it a chunked loop does in one call (limits.py)
-- `expr` is cjson.decode(Selector.compiled) = {v = 2, c = <STOMP coercion mode>, b = <evaluation budget>,
-- B = <a call's budget>, e = <tree>}.
-- `msg` is the table built by message.lua's selector_view (fields listed in broker_core/selector).
--
-- Values travel as two results (type, value). Types: 's' string, 'b' boolean, 'y' byte, 'h' short,
-- 'i' int, 'l' long, 'f' float, 'd' double, 'L' list (MAKELIST/SPLIT); a nil type is SQL NULL. A long
-- is a Lua number below 2^53 and an exact decimal string beyond; a float is a number rounded to
-- single precision.

-- selector.bytes: bytes every evaluation so far has spent (see `spend`), ever growing: a chunked loop
-- compares it with its value at the start of the call to end the chunk early (dispatch.lua, browse.lua).
-- (This file runs alone too, selector_match.lua: it uses nothing of base.lua, `lazy` included.)
local selector = { bytes = 0, call_limit = 1 / 0, eval = false, matches = false, error_message = false,
                   load = false }  -- (no math library at load time)
-- Built on first use: a script call that evaluates no selector does not pay for creating these closures
-- (Redis runs the whole script body on every call).
function selector.load()
  local selector_eval, selector_error_message
  local type, tostring, tonumber, pcall, error = type, tostring, tonumber, pcall, error
  local sfind, ssub, sbyte, sformat = string.find, string.sub, string.byte, string.format
  local sgsub, smatch, srep, slower = string.gsub, string.match, string.rep, string.lower
  local floor, fmod, huge, abs = math.floor, math.fmod, math.huge, math.abs
  local concat = table.concat
  local JSON_NULL = cjson.null
  local TWO31, TWO32, TWO53 = 2147483648, 4294967296, 9007199254740992
  local B = 'b'
  local NUMERIC = { y = 1, h = 2, i = 3, l = 4, f = 5, d = 6 }

  -- An error ActiveMQ raises while evaluating (a RuntimeException there): the selector does not match.
  local function raise(message)
    error({ selector_error = message }, 0)
  end

  local function f32(x)
    return (struct.unpack('f', struct.pack('f', x)))
  end

  -- A long from a number or a decimal string: a number when exact, else the canonical decimal string.
  local function long_value(v)
    if type(v) == 'number' then
      if v >= TWO53 or v <= -TWO53 then return sformat('%.0f', v) end
      return v + 0
    end
    if type(v) ~= 'string' then return nil end
    local sign, digits = smatch(v, '^([+-]?)0*(%d+)$')
    if not digits then
      local n = tonumber(v)
      if n == nil then return nil end
      return long_value(floor(n))
    end
    if #digits < 16 or tonumber(digits) < TWO53 then
      local n = tonumber(digits)
      if sign == '-' then n = 0 - n end
      return n
    end
    return (sign == '-' and '-' or '') .. digits
  end

  local function to_number(v)
    if type(v) == 'string' then return tonumber(v) end
    return v
  end

  -- Three-way comparisons -------------------------------------------------------------------------

  local function cmp_int(a, b)
    if type(a) == 'number' and type(b) == 'number' then
      if a < b then return -1 elseif a > b then return 1 end
      return 0
    end
    local sa = type(a) == 'string' and a or sformat('%.0f', a)
    local sb = type(b) == 'string' and b or sformat('%.0f', b)
    local na, nb = sbyte(sa, 1) == 45, sbyte(sb, 1) == 45
    if na ~= nb then return na and -1 or 1 end
    if na then sa, sb = ssub(sa, 2), ssub(sb, 2) end
    local r = 0
    if #sa ~= #sb then
      r = #sa < #sb and -1 or 1
    elseif sa ~= sb then
      for k = 1, #sa do
        local x, y = sbyte(sa, k), sbyte(sb, k)
        if x ~= y then r = x < y and -1 or 1 break end
      end
    end
    if na then r = -r end
    return r
  end

  -- Double.compare / Float.compare: a total order with -0.0 < 0.0 and NaN above everything.
  local function cmp_double(a, b)
    if a < b then return -1 elseif a > b then return 1 end
    local an, bn = a ~= a, b ~= b
    if an or bn then
      if an and bn then return 0 end
      return an and 1 or -1
    end
    if a == 0 then
      local ia, ib = 1 / a, 1 / b
      if ia < ib then return -1 elseif ia > ib then return 1 end
    end
    return 0
  end

  local function code_point(s, i)
    local c = sbyte(s, i)
    if c < 0xC0 then return c end
    local n, cp = 1, c - 0xC0
    if c >= 0xF0 then n, cp = 3, c - 0xF0 elseif c >= 0xE0 then n, cp = 2, c - 0xE0 end
    for k = 1, n do cp = cp * 64 + ((sbyte(s, i + k) or 0x80) - 0x80) end
    return cp
  end

  -- String.compareTo: UTF-16 code-unit order, which differs from UTF-8 byte order only in putting
  -- characters beyond U+FFFF (surrogate pairs) before U+E000..U+FFFF. Never uses the Redis locale.
  local function cmp_str(a, b)
    if a == b then return 0 end
    local la, lb = #a, #b
    local n = la < lb and la or lb
    local i = 1
    while i <= n do
      local j = i + 31
      if j > n then j = n end
      if ssub(a, i, j) ~= ssub(b, i, j) then
        while sbyte(a, i) == sbyte(b, i) do i = i + 1 end
        break
      end
      i = j + 1
    end
    if i > n then return la < lb and -1 or 1 end
    local k = i
    while k > 1 and sbyte(a, k) >= 0x80 and sbyte(a, k) < 0xC0 do k = k - 1 end
    local ca, cb = code_point(a, k), code_point(b, k)
    local ua = ca >= 0x10000 and 0xD800 + floor((ca - 0x10000) / 1024) or ca
    local ub = cb >= 0x10000 and 0xD800 + floor((cb - 0x10000) / 1024) or cb
    if ua ~= ub then return ua < ub and -1 or 1 end
    if ca ~= cb then return ca < cb and -1 or 1 end
    return sbyte(a, i) < sbyte(b, i) and -1 or 1
  end

  local function cmp_same(t, a, b)
    if t == 's' then return cmp_str(a, b) end
    if t == 'b' then
      if a == b then return 0 end
      return a and 1 or -1
    end
    if t == 'f' or t == 'd' then return cmp_double(a, b) end
    return cmp_int(a, b)
  end

  -- STOMP coercion: Byte/Short/Integer/Long.valueOf, Float/Double.valueOf, Boolean.valueOf --------------

  local INT_LIMIT = { y = 128, h = 32768, i = TWO31 }

  local function parse_java_integer(s, t)
    local sign, digits = smatch(s, '^([+-]?)(%d+)$')
    if not digits then return nil end
    digits = smatch(digits, '^0*(%d.*)$')
    if t == 'l' then
      if #digits > 19 then return nil end
      if #digits == 19 then
        local limit = sign == '-' and '9223372036854775808' or '9223372036854775807'
        if cmp_int(digits, limit) > 0 then return nil end
      end
      return long_value(sign .. digits)
    end
    local n = tonumber(digits)
    local limit = INT_LIMIT[t]
    if sign == '-' then
      if n > limit then return nil end
      return 0 - n
    end
    if n >= limit then return nil end
    return n
  end

  local function parse_java_double(s)
    -- String.trim (characters up to ' '), without a pattern that backtracks over a long run of spaces
    local first = sfind(s, '[^%z\1- ]')
    if not first then return nil end
    local last = #s
    while sbyte(s, last) <= 32 do last = last - 1 end
    s = ssub(s, first, last)
    local sign, body = smatch(s, '^([+-]?)(.*)$')
    if body == 'NaN' then return 0 / 0 end
    if body == 'Infinity' then return sign == '-' and -huge or huge end
    body = sgsub(body, '[fFdD]$', '', 1)
    local mantissa, exponent = smatch(body, '^([%d%.]+)([eE][+-]?%d+)$')
    if not mantissa then mantissa, exponent = smatch(body, '^([%d%.]+)$'), '' end
    if not mantissa or not sfind(mantissa, '%d') or sfind(mantissa, '%..*%.') then return nil end
    return tonumber(sign .. mantissa .. exponent)
  end

  local function coerce(s, t)
    if t == 'b' then return slower(s) == 'true' end
    if t == 'f' then
      local x = parse_java_double(s)
      return x and f32(x)
    end
    if t == 'd' then return parse_java_double(s) end
    return parse_java_integer(s, t)
  end

  -- ComparisonExpression.compare: -1/0/1, or nil when the types do not compare (the result is FALSE).
  -- Numbers widen Byte < Short < Integer < Long < Float < Double; in the STOMP mode a string is
  -- converted toward the other operand's type, and a conversion failure is FALSE.
  local function compare(lt, lv, rt, rv, convert)
    if lt == rt then return cmp_same(lt, lv, rv) end
    local rl, rr = NUMERIC[lt], NUMERIC[rt]
    if rl and rr then
      local top = rl > rr and rl or rr
      if top == 6 then return cmp_double(to_number(lv), to_number(rv)) end
      if top == 5 then return cmp_double(f32(to_number(lv)), f32(to_number(rv))) end
      return cmp_int(lv, rv)
    end
    if convert then
      if rt == 's' and (rl or lt == 'b') then
        local c = coerce(rv, lt)
        if c == nil then return nil end
        return cmp_same(lt, lv, c)
      end
      if lt == 's' and (rr or rt == 'b') then
        local c = coerce(lv, rt)
        if c == nil then return nil end
        return cmp_same(rt, c, rv)
      end
    end
    return nil
  end

  -- Object.equals, as MAKELIST/SPLIT lists and INLIST use it: same type and same value.
  local function java_equals(at, av, bt, bv)
    if at ~= bt then return false end
    if at == 'L' then
      if av.n ~= bv.n then return false end
      for k = 1, av.n do
        local x, y = av[k], bv[k]
        if x[1] ~= y[1] or (x[1] and not java_equals(x[1], x[2], y[1], y[2])) then return false end
      end
      return true
    end
    if at == 'f' or at == 'd' then return cmp_double(av, bv) == 0 end
    return av == bv
  end

  -- String.valueOf ---------------------------------------------------------------------------------

  -- Double.toString / Float.toString: the shortest digits that read back as the same value, plain
  -- between 10^-3 and 10^7, else computerized scientific notation ("1.0E10").
  local function java_fp(x, single)
    if x ~= x then return 'NaN' end
    if x == huge then return 'Infinity' end
    if x == -huge then return '-Infinity' end
    if x == 0 then return (1 / x < 0) and '-0.0' or '0.0' end
    local s
    for p = 0, 16 do
      s = sformat('%.' .. p .. 'e', x)
      local back = tonumber(s)
      if single then back = f32(back) end
      if back == x then break end
    end
    local sign, lead, rest, exp = smatch(s, '^(-?)(%d)%.?(%d*)e([-+]%d+)$')
    local digits = sgsub(lead .. rest, '0+$', '')
    if digits == '' then digits = '0' end
    local e = tonumber(exp)
    local a = abs(x)
    if a >= 1e-3 and a < 1e7 then
      if e >= 0 then
        local whole = ssub(digits, 1, e + 1)
        whole = whole .. srep('0', e + 1 - #whole)
        local frac = ssub(digits, e + 2)
        return sign .. whole .. '.' .. (frac == '' and '0' or frac)
      end
      return sign .. '0.' .. srep('0', -e - 1) .. digits
    end
    local frac = ssub(digits, 2)
    return sign .. ssub(digits, 1, 1) .. '.' .. (frac == '' and '0' or frac) .. 'E' .. e
  end

  local function java_string(t, v)
    if t == 's' then return v end
    if t == 'b' then return v and 'true' or 'false' end
    if t == 'd' then return java_fp(v, false) end
    if t == 'f' then return java_fp(v, true) end
    if t == 'L' then
      local parts = {}
      for k = 1, v.n do
        local e = v[k]
        parts[k] = e[1] and java_string(e[1], e[2]) or 'null'
      end
      return '[' .. concat(parts, ', ') .. ']'
    end
    if type(v) == 'string' then return v end
    return sformat('%.0f', v)
  end

  local TYPE_NAMES = { s = 'string', b = 'boolean', y = 'byte', h = 'short', i = 'int', l = 'long',
                       f = 'float', d = 'double', L = 'list' }
  local function describe(t, v)
    local shown = java_string(t, v)
    if #shown > 40 then shown = ssub(shown, 1, 37) .. '...' end
    return TYPE_NAMES[t] .. ' ' .. (t == 's' and "'" .. shown .. "'" or shown)
  end

  -- Patterns: DFAs over bytes (broker_core/selector/automata.py) -----------------------------------------

  -- What this evaluation may still spend, in bytes read by automata or written by REPLACE and string
  -- concatenation (the compiled selector's "b", limits.MAX_EVALUATION_BYTES); selector_eval sets it.
  local budget, budget_limit = 0, 0
  local MATCH_COST = 128  -- what one search for a match (REPLACE, SPLIT) costs besides its bytes
  local function spend(n)
    budget = budget - n
    selector.bytes = selector.bytes + n
    if budget < 0 then
      raise('matching this message takes more than ' .. budget_limit .. ' bytes (limit max_evaluation_bytes)')
    end
  end

  -- Lookup tables built once per decoded automaton: the class of each byte by its value (index 0 too),
  -- and the accepting states by their number times k.
  local function prepared(A)
    local C0 = A.c0
    if C0 then return C0, A.fa end
    local runs, F, k = A.c, A.f, A.k
    C0 = {}
    local b = 0
    for i = 1, #runs, 2 do
      for _ = 1, runs[i] do C0[b] = runs[i + 1] b = b + 1 end
    end
    local FA = {}
    for i = 1, #F do if F[i] == 1 then FA[(i - 1) * k] = true end end
    A.c0, A.fa = C0, FA
    return C0, FA
  end

  -- The bytes from..to (dir 1) or from down to `to` (dir -1) through automaton A from state st (states
  -- are multiples of A.k, so t[st + class] is the next one; those below A.x absorb). Returns the state,
  -- and with `track` the position of the last byte after which the state was accepting. Bytes are read
  -- eight at a time (string.byte is a function call); an absorbing state stays put, so reading a few
  -- bytes past the one that reached it changes nothing.
  local function run(A, s, st, from, to, dir, track)
    local T, x = A.t, A.x
    local C, FA = prepared(A)
    local count = (to - from) * dir + 1
    if count > budget then
      to = from + (budget - 1) * dir  -- may still stop early; past it the limit is raised below
    end
    local last
    local p = from
    if not track then
      while st >= x and p + 7 <= to do
        local b1, b2, b3, b4, b5, b6, b7, b8 = sbyte(s, p, p + 7)
        st = T[st + C[b1]] st = T[st + C[b2]] st = T[st + C[b3]] st = T[st + C[b4]]
        st = T[st + C[b5]] st = T[st + C[b6]] st = T[st + C[b7]] st = T[st + C[b8]]
        p = p + 8
      end
    elseif dir == 1 then
      while st >= x and p + 7 <= to do
        local b1, b2, b3, b4, b5, b6, b7, b8 = sbyte(s, p, p + 7)
        st = T[st + C[b1]] if FA[st] then last = p end
        st = T[st + C[b2]] if FA[st] then last = p + 1 end
        st = T[st + C[b3]] if FA[st] then last = p + 2 end
        st = T[st + C[b4]] if FA[st] then last = p + 3 end
        st = T[st + C[b5]] if FA[st] then last = p + 4 end
        st = T[st + C[b6]] if FA[st] then last = p + 5 end
        st = T[st + C[b7]] if FA[st] then last = p + 6 end
        st = T[st + C[b8]] if FA[st] then last = p + 7 end
        p = p + 8
      end
    else
      while st >= x and p - 7 >= to do
        local b1, b2, b3, b4, b5, b6, b7, b8 = sbyte(s, p - 7, p)
        st = T[st + C[b8]] if FA[st] then last = p end
        st = T[st + C[b7]] if FA[st] then last = p - 1 end
        st = T[st + C[b6]] if FA[st] then last = p - 2 end
        st = T[st + C[b5]] if FA[st] then last = p - 3 end
        st = T[st + C[b4]] if FA[st] then last = p - 4 end
        st = T[st + C[b3]] if FA[st] then last = p - 5 end
        st = T[st + C[b2]] if FA[st] then last = p - 6 end
        st = T[st + C[b1]] if FA[st] then last = p - 7 end
        p = p - 8
      end
    end
    while st >= x and p ~= to + dir do
      st = T[st + C[sbyte(s, p)]]
      if track and FA[st] then last = p end
      p = p + dir
    end
    spend((p - from) * dir)
    if st >= x and count > (p - from) * dir then spend(count) end  -- stopped by the budget
    return st, last
  end

  local function accepting(A, st) return A.f[st / A.k + 1] == 1 end

  -- LIKE and REGEX: does the automaton accept the value (REGEX: find it anywhere)?
  local function occurs(A, s)
    return accepting(A, (run(A, s, A.s, 1, #s, 1)))
  end

  local function char_length(s, i)
    local c = sbyte(s, i)
    if not c or c < 0xC0 then return 1 end
    if c >= 0xF0 then return 4 elseif c >= 0xE0 then return 3 end
    return 2
  end

  -- Matcher.find() from byte `pos` (a character boundary): the first and last byte of the match (last =
  -- first - 1 for an empty one), or nil. P = {f = forward, r = reversed, a = anchored at the start,
  -- z = at the end}. The forward run finds where the match Java would choose ends; the reversed pattern,
  -- run backwards from there, finds its leftmost start (automata.py).
  local function find_span(P, s, pos)
    local F, n = P.f, #s
    if P.a and pos > 1 then return nil end
    spend(MATCH_COST)
    local e
    local st, last = run(F, s, F.s, pos, n, 1, not P.z)
    if P.z then
      if not accepting(F, st) then return nil end
      e = n
    else
      e = last
      if st < F.x and accepting(F, st) then e = n  -- absorbing and accepting: it matches up to the end
      elseif not e and accepting(F, F.s) then e = pos - 1 end
    end
    if not e then return nil end
    if P.a then return pos, e end
    local R = P.r
    local a
    st, a = run(R, s, R.s, e, pos, -1, true)
    if st < R.x and accepting(R, st) then a = pos
    elseif not a and accepting(R, R.s) then a = e + 1 end
    return a, e
  end

  -- Matcher.find() over the whole input: fn(first, last) per match (last < first for an empty one);
  -- fn returning false stops. After an empty match the search resumes one character later.
  local function each_match(s, P, fn)
    local pos, n = 1, #s
    while pos <= n + 1 do
      local a, b = find_span(P, s, pos)
      if not a then return end
      if fn(a, b) == false or P.a then return end
      if b >= a then
        pos = b + 1
      else
        if a > n then return end
        pos = a + char_length(s, a)
      end
    end
  end

  -- Matcher.replaceAll's replacement syntax, with no groups in the pattern: '\x' is x, '$0' (and
  -- '$00'...) is the whole match; any other '$' is an error. Returns parts, `true` for the match.
  local function replacement_parts(r)
    local parts, k, n = {}, 1, #r
    local literal = {}
    while k <= n do
      local c = ssub(r, k, k)
      if c == '\\' then
        if k == n then raise('REPLACE: the replacement ends with an unfinished escape') end
        literal[#literal + 1] = ssub(r, k + 1, k + 1)
        k = k + 2
      elseif c == '$' then
        local d = ssub(r, k + 1, k + 1)
        if d == '0' then
          if #literal > 0 then parts[#parts + 1] = concat(literal) literal = {} end
          parts[#parts + 1] = true
          k = k + 2
          while ssub(r, k, k) == '0' do k = k + 1 end
        elseif smatch(d, '^%d$') then
          raise('REPLACE: no group ' .. d .. ' (the pattern has no groups)')
        else
          raise("REPLACE: illegal group reference in the replacement (write '\\$' for a dollar sign)")
        end
      else
        literal[#literal + 1] = c
        k = k + 1
      end
    end
    if #literal > 0 then parts[#parts + 1] = concat(literal) end
    return parts
  end

  -- Headers and properties --------------------------------------------------------------------------

  local function str_field(v)
    local tv = type(v)
    if tv == 'string' then return 's', v end
    if tv == 'number' then return 's', tostring(v) end
    return nil
  end

  local function property(m, name)
    local props = m.props
    if type(props) ~= 'table' then return nil end
    local p = props[name]
    if type(p) ~= 'table' then return nil end
    local t, v = p[1], p[2]
    if v == nil or v == JSON_NULL then return nil end
    if t == 's' then
      if type(v) ~= 'string' then v = tostring(v) end
      return 's', v
    elseif t == 'b' then
      return 'b', v == true or v == 1 or v == 'true'
    elseif t == 'i' or t == 'y' or t == 'h' then
      v = tonumber(v)
      if v == nil then return nil end
      return t, v
    elseif t == 'l' then
      v = long_value(v)
      if v == nil then return nil end
      return 'l', v
    elseif t == 'f' or t == 'd' then
      v = tonumber(v)
      if v == nil then return nil end
      if t == 'f' then v = f32(v) end
      return t, v
    end
    raise('property ' .. tostring(name) .. ' has an unknown type code ' .. tostring(t))
  end

  local function redeliveries(m) return tonumber(m.redelivery) or 0 end

  -- PropertyExpression's JMS header table (spec §4.2); these names never read user properties
  -- (except JMSXUserID, which falls back to one, as ActiveMQ does).
  local HEADERS = {
    JMSDestination = function(m)
      local d = m.orig_dest
      if type(d) ~= 'string' or d == '' then d = m.dest end
      return str_field(d)
    end,
    JMSReplyTo = function(m) return str_field(m.reply_to) end,
    JMSType = function(m) return str_field(m.type) end,
    JMSDeliveryMode = function(m)
      return 's', (m.persistent == true or m.persistent == 1) and 'PERSISTENT' or 'NON_PERSISTENT'
    end,
    JMSPriority = function(m) return 'i', tonumber(m.priority) or 4 end,
    JMSMessageID = function(m) return str_field(m.id) end,
    JMSTimestamp = function(m) return 'l', long_value(m.timestamp) or 0 end,
    JMSCorrelationID = function(m) return str_field(m.corr_id) end,
    JMSExpiration = function(m) return 'l', long_value(m.expiration) or 0 end,
    JMSRedelivered = function(m) return 'b', redeliveries(m) > 0 end,
    JMSXDeliveryCount = function(m) return 'i', redeliveries(m) + 1 end,
    JMSXGroupID = function(m) return str_field(m.group_id) end,
    JMSXGroupSeq = function(m) return 'i', tonumber(m.group_seq) or 0 end,
    JMSXUserID = function(m)
      local t, v = str_field(m.user_id)
      if t then return t, v end
      return property(m, 'JMSXUserID')
    end,
    JMSXProducerTXID = function(m) return str_field(m.producer_tx) end,
    JMSActiveMQBrokerInTime = function(m) return 'l', long_value(m.broker_in) or 0 end,
    JMSActiveMQBrokerOutTime = function(m) return 'l', long_value(m.broker_out) or 0 end,
    -- Arrays.toString of the broker path: the string "null" when there is none.
    JMSActiveMQBrokerPath = function(m)
      local t, v = str_field(m.broker_path)
      if t then return t, v end
      return 's', 'null'
    end,
    JMSXGroupFirstForConsumer = function(m) return 'b', m.group_first == true end,
  }

  -- The evaluator ------------------------------------------------------------------------------------

  local OPS = {}
  local function ev(node, m, c)
    return OPS[node[1]](node, m, c)
  end

  OPS.s = function(node) return 's', node[2] end
  OPS.i = function(node) return 'i', node[2] end
  OPS.l = function(node) return 'l', long_value(node[2]) end
  OPS.d = function(node)
    local v = node[2]
    if type(v) == 'string' then v = tonumber(v) end
    return 'd', v
  end
  OPS.b = function(node) return B, node[2] end
  OPS.null = function() return nil end
  OPS.id = function(node, m) return property(m, node[2]) end
  OPS.hdr = function(node, m) return HEADERS[node[2]](m) end
  OPS.xquery = function() return B, false end

  OPS['and'] = function(node, m, c)
    local unknown = false
    for k = 2, #node do
      local t, v = ev(node[k], m, c)
      if t == nil then unknown = true elseif not v then return B, false end
    end
    if unknown then return nil end
    return B, true
  end

  OPS['or'] = function(node, m, c)
    local unknown = false
    for k = 2, #node do
      local t, v = ev(node[k], m, c)
      if t == nil then unknown = true elseif v then return B, true end
    end
    if unknown then return nil end
    return B, false
  end

  OPS['not'] = function(node, m, c)
    local t, v = ev(node[2], m, c)
    if t == nil then return nil end
    return B, not v
  end

  -- A bare property used as a condition: TRUE only for a boolean true.
  OPS.bool = function(node, m, c)
    local t, v = ev(node[2], m, c)
    if t == nil then return nil end
    return B, t == 'b' and v == true
  end

  OPS.isnull = function(node, m, c)
    local t = ev(node[2], m, c)
    return B, t == nil
  end

  -- Equality is asymmetric about NULL: left NULL gives NULL, right-only NULL gives FALSE.
  OPS.eq = function(node, m, c)
    local lt, lv = ev(node[2], m, c)
    local rt, rv = ev(node[3], m, c)
    if lt == nil then
      if rt == nil then return B, true end
      return nil
    end
    if rt == nil then return B, false end
    if lt == 'L' or rt == 'L' then return B, java_equals(lt, lv, rt, rv) end
    return B, compare(lt, lv, rt, rv, c) == 0
  end

  local function ordering(node, m, c)
    local lt, lv = ev(node[2], m, c)
    if lt == nil then return false end
    if lt == 'L' then raise('a list cannot be compared with < <= > >=') end
    local rt, rv = ev(node[3], m, c)
    if rt == nil then return false end
    if rt == 'L' then raise('a list cannot be compared with < <= > >=') end
    return true, compare(lt, lv, rt, rv, c)
  end
  OPS.lt = function(node, m, c)
    local known, r = ordering(node, m, c)
    if not known then return nil end
    return B, r ~= nil and r < 0
  end
  OPS.le = function(node, m, c)
    local known, r = ordering(node, m, c)
    if not known then return nil end
    return B, r ~= nil and r <= 0
  end
  OPS.gt = function(node, m, c)
    local known, r = ordering(node, m, c)
    if not known then return nil end
    return B, r ~= nil and r > 0
  end
  OPS.ge = function(node, m, c)
    local known, r = ordering(node, m, c)
    if not known then return nil end
    return B, r ~= nil and r >= 0
  end

  OPS.like = function(node, m, c)
    local t, v = ev(node[2], m, c)
    if t == nil then return nil end
    if t ~= 's' then return B, false end
    return B, occurs(node[3], v)
  end

  -- IN gives NULL for NULL and for any non-string value, for IN and NOT IN alike.
  OPS['in'] = function(node, m, c)
    local t, v = ev(node[2], m, c)
    if t ~= 's' then return nil end
    return B, (node[3][v] == true) ~= (node[4] == true)
  end

  -- Arithmetic: NULL in, NULL out (the right side is not evaluated when the left is NULL).
  local function operands(node, m, c)
    local lt, lv = ev(node[2], m, c)
    if lt == nil then return nil end
    local rt, rv = ev(node[3], m, c)
    if rt == nil then return nil end
    return lt, lv, rt, rv
  end

  local OP_NAMES = { add = 'add', sub = 'subtract', mul = 'multiply', div = 'divide', mod = 'take the remainder of' }
  local function check_numbers(op, lt, lv, rt, rv)
    if not NUMERIC[lt] or not NUMERIC[rt] then
      raise('cannot ' .. OP_NAMES[op] .. ' ' .. describe(lt, lv) .. ' and ' .. describe(rt, rv))
    end
  end

  -- + - * give int (wrapping at 32 bits, as Java does), long or double from the operand types.
  local function kind_of(lt, rt)
    if lt == 'f' or lt == 'd' or rt == 'f' or rt == 'd' then return 'd' end
    if lt == 'l' or rt == 'l' then return 'l' end
    return 'i'
  end
  local function integral(kind, r)
    if kind == 'i' then
      r = r % TWO32
      if r >= TWO31 then r = r - TWO32 end
      return 'i', r + 0
    end
    return 'l', long_value(r)
  end
  local function mul32(a, b)
    a, b = a % TWO32, b % TWO32
    local high, low = floor(b / 65536), b % 65536
    return (a * low + ((a * high) % 65536) * 65536) % TWO32
  end

  OPS.add = function(node, m, c)
    local lt, lv, rt, rv = operands(node, m, c)
    if lt == nil then return nil end
    if lt == 's' then
      local r = lv .. java_string(rt, rv)
      spend(#r)
      return 's', r
    end
    check_numbers('add', lt, lv, rt, rv)
    local kind = kind_of(lt, rt)
    local r = to_number(lv) + to_number(rv)
    if kind == 'd' then return 'd', r end
    return integral(kind, r)
  end
  OPS.sub = function(node, m, c)
    local lt, lv, rt, rv = operands(node, m, c)
    if lt == nil then return nil end
    check_numbers('sub', lt, lv, rt, rv)
    local kind = kind_of(lt, rt)
    local r = to_number(lv) - to_number(rv)
    if kind == 'd' then return 'd', r end
    return integral(kind, r)
  end
  OPS.mul = function(node, m, c)
    local lt, lv, rt, rv = operands(node, m, c)
    if lt == nil then return nil end
    check_numbers('mul', lt, lv, rt, rv)
    local kind = kind_of(lt, rt)
    if kind == 'i' then return integral('i', mul32(lv, rv)) end
    local r = to_number(lv) * to_number(rv)
    if kind == 'd' then return 'd', r end
    return integral(kind, r)
  end
  -- '/' and '%' always give a double; '%' is Java's truncated remainder (fmod), not Lua's floored one.
  OPS.div = function(node, m, c)
    local lt, lv, rt, rv = operands(node, m, c)
    if lt == nil then return nil end
    check_numbers('div', lt, lv, rt, rv)
    return 'd', to_number(lv) / to_number(rv)
  end
  OPS.mod = function(node, m, c)
    local lt, lv, rt, rv = operands(node, m, c)
    if lt == nil then return nil end
    check_numbers('mod', lt, lv, rt, rv)
    return 'd', fmod(to_number(lv), to_number(rv))
  end

  -- Unary minus: NULL for NULL and for anything that is not a number.
  OPS.neg = function(node, m, c)
    local t, v = ev(node[2], m, c)
    if t == nil or not NUMERIC[t] then return nil end
    if t == 'f' or t == 'd' then return t, -v end
    if t == 'l' then
      if type(v) == 'string' then
        if v == '-9223372036854775808' then return 'l', v end
        if sbyte(v, 1) == 45 then return 'l', ssub(v, 2) end
        return 'l', '-' .. v
      end
      return 'l', 0 - v
    end
    if v == -TWO31 then return 'i', v end
    return 'i', 0 - v
  end

  -- Functions (ActiveMQ's BuiltinFunctionRegistry) -----------------------------------------------------

  local function new_list() return { n = 0 } end
  local function list_add(list, t, v)
    list.n = list.n + 1
    list[list.n] = { t or false, v }
  end

  OPS.makelist = function(node, m, c)
    local list = new_list()
    for k = 2, #node do list_add(list, ev(node[k], m, c)) end
    return 'L', list
  end

  OPS.inlist = function(node, m, c)
    local lt, lv = ev(node[2], m, c)
    local ct, cv = ev(node[3], m, c)
    if lt ~= 'L' then raise('INLIST needs a list (MAKELIST or SPLIT) as its first argument') end
    for k = 1, lv.n do
      local e = lv[k]
      if not e[1] then raise('INLIST: the list holds a NULL') end
      if ct ~= nil and java_equals(e[1], e[2], ct, cv) then return B, true end
    end
    return B, false
  end

  -- REGEX(pattern, value): find anywhere in String.valueOf(value); FALSE when the value is NULL.
  OPS.regex = function(node, m, c)
    local t, v = ev(node[3], m, c)
    if t == nil then return B, false end
    return B, occurs(node[2], java_string(t, v))
  end

  OPS.replace = function(node, m, c)
    local st, sv = ev(node[2], m, c)
    local pattern = node[3]
    local rt, rv = ev(node[4], m, c)
    if st ~= 's' then raise('REPLACE needs a string to work on, not ' .. (st and describe(st, sv) or 'NULL')) end
    if rt ~= 's' then raise('REPLACE needs a string replacement, not ' .. (rt and describe(rt, rv) or 'NULL')) end
    local parts = replacement_parts(rv)
    local out, last = {}, 1
    each_match(sv, pattern, function(a, b)
      out[#out + 1] = ssub(sv, last, a - 1)
      for k = 1, #parts do
        local part = parts[k]
        out[#out + 1] = part == true and ssub(sv, a, b) or part
        spend(#out[#out])
      end
      last = b + 1
    end)
    out[#out + 1] = ssub(sv, last)
    return 's', concat(out)
  end

  -- SPLIT(s, regex[, limit]): String.split, including its rules for leading and trailing empties.
  OPS.split = function(node, m, c)
    local st, sv = ev(node[2], m, c)
    local pattern = node[3]
    local limit = 0
    if node[4] ~= nil then
      local lt, lv = ev(node[4], m, c)
      if lt ~= 'i' then raise('SPLIT needs an int limit, not ' .. (lt and describe(lt, lv) or 'NULL')) end
      limit = lv
    end
    if st ~= 's' then raise('SPLIT needs a string to work on, not ' .. (st and describe(st, sv) or 'NULL')) end
    local pieces, index = {}, 1
    each_match(sv, pattern, function(a, b)
      if limit <= 0 or #pieces < limit - 1 then
        if index == 1 and a == 1 and b < a then return end
        pieces[#pieces + 1] = ssub(sv, index, a - 1)
        index = b + 1
      elseif #pieces == limit - 1 then
        pieces[#pieces + 1] = ssub(sv, index)
        index = b + 1
        return false
      end
    end)
    if index == 1 then
      pieces = { sv }
    else
      if limit <= 0 or #pieces < limit then pieces[#pieces + 1] = ssub(sv, index) end
      if limit == 0 then
        while #pieces > 0 and pieces[#pieces] == '' do pieces[#pieces] = nil end
      end
    end
    local list = new_list()
    for k = 1, #pieces do list_add(list, 's', pieces[k]) end
    return 'L', list
  end

  selector_eval = function(expr, msg)
    budget_limit = expr.b or 0
    budget = budget_limit
    selector.call_limit = expr.B or budget_limit
    local t, v = ev(expr.e, msg, expr.c == true)
    if t == B then return v end
    return nil
  end

  selector_error_message = function(err)
    if type(err) == 'table' and err.selector_error then return err.selector_error end
    return nil
  end

  selector.eval, selector.error_message = selector_eval, selector_error_message
  function selector.matches(expr, msg)
    local ok, r = pcall(selector_eval, expr, msg)
    if ok then return r == true end
    return false, selector_error_message(r) or tostring(r)
  end
end

function selector.eval(expr, msg) selector.load() return selector.eval(expr, msg) end
function selector.matches(expr, msg) selector.load() return selector.matches(expr, msg) end
function selector.error_message(err) selector.load() return selector.error_message(err) end
