-- Replay dead-letter entries by id with nothing read or rewritten by the caller:
-- each entry is read, its envelope rewritten here and the job sent back, in one
-- call per batch (what dlq_fetch.lua + a decode and re-encode in Python +
-- dlq_move.lua did in three steps, the envelope crossing the network twice).
--
-- The envelope (engine/jobs/envelope.py: a msgpack array of 14) is edited as
-- bytes, never unpacked into Lua tables (which would turn an empty map into an
-- array, 1.0 into 1 and drop nils from the job's arguments): every field is
-- copied as it is but attempt, max_attempts, the error history, replays and
-- deaths, exactly as DeadLetters._replayed writes them in Python; the error
-- records get back what engine/dlq/shared.py took out of them (the traceback
-- from <dlq>:tb:<fp>, with the record's message where MESSAGE marks it; the
-- last record's class and message from the entry's fields), in the order
-- Python's restore_record and resolve put them, so the bytes are Python's.
--
-- An entry this does not rewrite is left in the DLQ, untouched, and its id
-- returned for the caller's own path (dlq_fetch.lua, decode, dlq_move.lua):
-- a panic (its history gets a record Python writes), an entry written before
-- the index (no fp field), a payload that is not such an envelope, or one whose
-- values decode() would refuse or change.
--
-- KEYS[1] dlq   KEYS[2] stream   KEYS[3] delayed   KEYS[4] all-time totals (counts "replayed")
-- ARGV[1] the replay marks' key prefix ({chasqui:<q>}:rjob:)   ARGV[2] their lifetime (ms)
-- ARGV[3] '1': give each job its whole budget again (attempt 0); '0': exactly one more run
-- ARGV[4] run at epoch ms ('' = now)
-- ARGV[5..] entry ids
-- Returns {moved, left id, left id, ...}: how many entries were moved, then the ids left for the caller
-- (an id no longer in the DLQ is neither: someone else replayed or discarded it).
--
-- Calls server_ms, mark_delayed, band_of and band_stream from prelude.lua; dlq_removal, dlq_indexed,
-- dlq_take_known and dlq_removal_flush from dlq_index.lua.

local dlq, stream, delayed = KEYS[1], KEYS[2], KEYS[3]
local marks, life, reset, run_at = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4]
local byte, sub, char = string.byte, string.sub, string.char

local function uint(s, at, n)
  local v = 0
  for k = at, at + n - 1 do
    v = v * 256 + byte(s, k)
  end
  return v
end

-- The next position after the msgpack value at `at`.
local function skip_any(s, at)
  local left = 1
  while left > 0 do
    local b = byte(s, at)
    if not b then
      error('short')
    end
    left = left - 1
    if b <= 0x7f or b >= 0xe0 or b == 0xc0 or b == 0xc2 or b == 0xc3 then
      at = at + 1
    elseif b <= 0x8f then
      left, at = left + 2 * (b - 0x80), at + 1
    elseif b <= 0x9f then
      left, at = left + (b - 0x90), at + 1
    elseif b <= 0xbf then
      at = at + 1 + b - 0xa0
    elseif b == 0xc4 or b == 0xd9 then
      at = at + 2 + byte(s, at + 1)
    elseif b == 0xc5 or b == 0xda then
      at = at + 3 + uint(s, at + 1, 2)
    elseif b == 0xc6 or b == 0xdb then
      at = at + 5 + uint(s, at + 1, 4)
    elseif b == 0xc7 then
      at = at + 3 + byte(s, at + 1)
    elseif b == 0xc8 then
      at = at + 4 + uint(s, at + 1, 2)
    elseif b == 0xc9 then
      at = at + 6 + uint(s, at + 1, 4)
    elseif b == 0xca then
      at = at + 5
    elseif b == 0xcb then
      at = at + 9
    elseif b == 0xcc or b == 0xd0 then
      at = at + 2
    elseif b == 0xcd or b == 0xd1 then
      at = at + 3
    elseif b == 0xce or b == 0xd2 then
      at = at + 5
    elseif b == 0xcf or b == 0xd3 then
      at = at + 9
    elseif b >= 0xd4 and b <= 0xd8 then
      at = at + 2 + ({1, 2, 4, 8, 16})[b - 0xd3]
    elseif b == 0xdc then
      left, at = left + uint(s, at + 1, 2), at + 3
    elseif b == 0xdd then
      left, at = left + uint(s, at + 1, 4), at + 5
    elseif b == 0xde then
      left, at = left + 2 * uint(s, at + 1, 2), at + 3
    elseif b == 0xdf then
      left, at = left + 2 * uint(s, at + 1, 4), at + 5
    else
      error('not msgpack')
    end
  end
  return at
end

-- skip_any, with one call for the scalars error records and envelopes are mostly made of.
local function skip(s, at)
  local b = byte(s, at)
  if b <= 0x7f or b >= 0xe0 or b == 0xc0 or b == 0xc2 or b == 0xc3 then
    return at + 1
  elseif b >= 0xa0 and b <= 0xbf then
    return at + 1 + b - 0xa0
  end
  return skip_any(s, at)
end

-- A non-negative int as msgpack packs it (the smallest form), and back.
local function pack_uint(v)
  if v <= 0x7f then
    return char(v)
  elseif v <= 0xff then
    return char(0xcc, v)
  elseif v <= 0xffff then
    return char(0xcd, math.floor(v / 256), v % 256)
  elseif v <= 0xffffffff then
    return char(0xce, math.floor(v / 16777216), math.floor(v / 65536) % 256, math.floor(v / 256) % 256, v % 256)
  end
  error('too big')
end

local function read_uint(s, at)
  local b = byte(s, at)
  if b <= 0x7f then
    return b
  elseif b == 0xcc then
    return byte(s, at + 1)
  elseif b == 0xcd then
    return uint(s, at + 1, 2)
  elseif b == 0xce then
    return uint(s, at + 1, 4)
  elseif b == 0xcf then
    return uint(s, at + 1, 8)
  end
  return nil
end

-- A str as msgpack (use_bin_type) packs it, and the text of a packed str (nil for any other type).
local function pack_str(t)
  local n = #t
  if n <= 31 then
    return char(0xa0 + n) .. t
  elseif n <= 0xff then
    return char(0xd9, n) .. t
  elseif n <= 0xffff then
    return char(0xda, math.floor(n / 256), n % 256) .. t
  end
  return char(0xdb, math.floor(n / 16777216), math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256) .. t
end

-- The length of a str8/16/32 at `at` whose first byte is b.
local function str_length(s, at, b)
  return uint(s, at + 1, ({1, 2, 4})[b - 0xd8])
end

local function read_str(s, at)
  local b = byte(s, at)
  if b >= 0xa0 and b <= 0xbf then
    return sub(s, at + 1, at + b - 0xa0)
  elseif b == 0xd9 then
    return sub(s, at + 2, at + 1 + byte(s, at + 1))
  elseif b == 0xda then
    return sub(s, at + 3, at + 2 + uint(s, at + 1, 2))
  elseif b == 0xdb then
    return sub(s, at + 5, at + 4 + uint(s, at + 1, 4))
  end
  return nil
end

local function nonempty_str(s, at)
  local b = byte(s, at)
  return (b > 0xa0 and b <= 0xbf) or (b >= 0xd9 and b <= 0xdb and str_length(s, at, b) > 0)
end

local function is_map(s, at)
  local b = byte(s, at)
  return (b >= 0x80 and b <= 0x8f) or b == 0xde or b == 0xdf
end

local function is_array(s, at)
  local b = byte(s, at)
  return (b >= 0x90 and b <= 0x9f) or b == 0xdc or b == 0xdd
end

-- A container's item count and where its first item starts.
local function header(s, at)
  local b = byte(s, at)
  if b >= 0x80 and b <= 0x8f then
    return b - 0x80, at + 1
  elseif b >= 0x90 and b <= 0x9f then
    return b - 0x90, at + 1
  elseif b == 0xdc or b == 0xde then
    return uint(s, at + 1, 2), at + 3
  end
  return uint(s, at + 1, 4), at + 5
end

local function map_header(n)
  if n <= 15 then
    return char(0x80 + n)
  elseif n <= 0xffff then
    return char(0xde, math.floor(n / 256), n % 256)
  end
  error('too many')
end

local texts_cache = {}
local function shared_text(fp, tid)
  local texts = texts_cache[fp]
  if not texts then
    texts = {}
    texts_cache[fp] = texts
  end
  local text = texts[tid]
  if text == nil then
    text = redis.call('HGET', dlq .. ':tb:' .. fp, tid) or ''
    texts[tid] = text
  end
  return text
end

-- One error record with what the DLQ took out of it put back (shared.restore_record, then shared.resolve):
-- the pairs kept in their order, then class and message, then traceback, as Python's dict puts them.
local function record_back(s, at, last, fields)
  local n, p = header(s, at)
  local kept, seen, tid, from_entry, message = {}, {}, nil, false, ''
  local count, span = 0, p
  for _ = 1, n do
    local key = read_str(s, p)
    if key == nil or seen[key] then
      error('key')
    end
    seen[key] = true
    local v = skip(s, p)
    local after = skip(s, v)
    local b = byte(s, v)
    local drop = false
    if key == 'tb' then
      tid, drop = read_str(s, v), true
      if tid == nil then
        error('tb')
      end
    elseif key == 'entry' and last and (b == 0x01 or b == 0xc3) then
      from_entry, drop = true, true
    elseif key == 'entry' and last and b ~= 0x00 and b ~= 0xc2 and b ~= 0xc0 then
      error('entry')
    else
      if key == 'message' then
        message = read_str(s, v)
        if message == nil then
          error('message')
        end
      end
      count = count + 1
    end
    if drop then
      -- the pairs kept so far are copied as one span
      kept[#kept + 1] = sub(s, span, p - 1)
      span = after
    end
    p = after
  end
  kept[#kept + 1] = sub(s, span, p - 1)
  if (from_entry and (seen['class'] or seen['message'])) or (tid ~= nil and seen['traceback']) then
    error('both')
  end
  if from_entry then
    message = fields['error'] or ''
    kept[#kept + 1] = pack_str('class') .. pack_str(fields['error_class'] or '')
    kept[#kept + 1] = pack_str('message') .. pack_str(message)
    count = count + 2
  end
  if tid ~= nil then
    local text = shared_text(fields['fp'], tid)
    local cut, from = nil, 1
    while true do
      local found = string.find(text, '\0', from, true)
      if not found then
        break
      end
      cut, from = found, found + 1
    end
    if cut then
      text = sub(text, 1, cut - 1) .. message .. sub(text, cut + 1)
    end
    kept[#kept + 1] = pack_str('traceback') .. pack_str(text)
    count = count + 1
  end
  return map_header(count) .. table.concat(kept), p
end

-- The envelope to send back (DeadLetters._replayed), or an error when it is not one this rewrites.
local function replayed(s, fields)
  if byte(s, 1) ~= 0x9e or byte(s, 2) ~= 0x01 then
    error('layout')
  end
  local starts = {}
  local p = 2
  local records
  for i = 1, 14 do
    starts[i] = p
    if i == 10 then
      -- the error history, read once: its records put back as they are passed
      if not is_array(s, p) then
        error('types')
      end
      local n, q = header(s, p)
      records = {sub(s, p, q - 1)}
      for k = 1, n do
        if not is_map(s, q) then
          error('record')
        end
        records[k + 1], q = record_back(s, q, k == n, fields)
      end
      p = q
    else
      p = skip(s, p)
    end
  end
  if p ~= #s + 1 then
    error('trailing')
  end
  starts[15] = p
  local function field(i)
    return sub(s, starts[i], starts[i + 1] - 1)
  end
  -- what decode() checks, so an entry it would refuse (or read differently) is left to Python
  if not nonempty_str(s, starts[2]) or not nonempty_str(s, starts[3]) or not is_array(s, starts[4])
      or not is_map(s, starts[5]) or not is_map(s, starts[14]) then
    error('types')
  end
  local attempt, replays = read_uint(s, starts[6]), read_uint(s, starts[11])
  local ttl = read_uint(s, starts[12])
  if not attempt or not replays or not ttl or ttl > 366 * 24 * 3600 or not read_uint(s, starts[13])
      or not read_uint(s, starts[7]) then
    error('numbers')
  end
  local max_b = byte(s, starts[8])
  if max_b ~= 0xc0 and not (read_uint(s, starts[8]) and read_uint(s, starts[8]) >= 1) then
    error('max_attempts')
  end
  local backoff_b = byte(s, starts[9])
  if backoff_b ~= 0xc0 and not is_map(s, starts[9]) then
    error('backoff')
  end
  local max_attempts
  if reset then
    attempt, max_attempts = 0, field(8)
  else
    max_attempts = pack_uint(attempt + 1)
  end
  return sub(s, 1, starts[6] - 1) .. pack_uint(attempt) .. field(7) .. max_attempts .. field(9)
    .. table.concat(records) .. pack_uint(replays + 1) .. field(12) .. char(0) .. field(14)
end

local removal = dlq_removal(dlq)
local left = {}
local ready, flat = {}, {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local rows = redis.call('XRANGE', dlq, id, id)
  if #rows > 0 then
    local raw = rows[1][2]
    local f = {}
    for k = 1, #raw, 2 do
      f[raw[k]] = raw[k + 1]
    end
    local ok, payload = false, nil
    if f['fp'] and f['reason'] ~= 'panic' and f['j'] and (f['job_id'] or '') ~= '' then
      ok, payload = pcall(replayed, f['j'], f)
    end
    if ok then
      ready[#ready + 1] = {id, payload, f}
      flat[#flat + 1] = id
      for _ = 1, 3 do
        flat[#flat + 1] = ''
      end
      flat[#flat + 1] = f['reason'] or ''
    else
      left[#left + 1] = id
    end
  end
end

local indexed = dlq_indexed(dlq, flat, 1, 5)
local moved, now = 0, nil
for _, entry in ipairs(ready) do
  local id, payload, f = entry[1], entry[2], entry[3]
  if dlq_take_known(removal, id, f['reason'] or '', f['task'] or '', f['error_class'] or '', f['fp'],
      f['job_id'] or '', indexed[id]) then
    if run_at == '' then
      local band = band_of(payload)
      local eid = redis.call('XADD', band_stream(stream, band), '*', 'j', payload)
      redis.call('SET', marks .. f['job_id'], band .. ' ' .. eid, 'PX', life)
    else
      local at = tonumber(run_at)
      redis.call('ZADD', delayed, at, payload)
      now = now or server_ms()
      mark_delayed(delayed, payload, at, now)
    end
    moved = moved + 1
  end
end
dlq_removal_flush(removal)
if moved > 0 then
  redis.call('HINCRBY', KEYS[4], 'replayed', moved)
end
local out = {moved}
for _, id in ipairs(left) do
  out[#out + 1] = id
end
return out
