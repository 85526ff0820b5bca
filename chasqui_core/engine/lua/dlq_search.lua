-- Scan one chunk of a DLQ, newest first, for entries whose text holds a needle, whatever its case.
--
-- An entry is a candidate when the needle is found in its envelope bytes
-- (which hold the job id, the task, the arguments and the error history with
-- each error's class and message) or in its last error (which differs from
-- the envelope's for a run lost with its worker), ASCII letters compared
-- without case. Only those two fields are read: each plain find is a call,
-- and calls, not bytes, are what a scan pays for. The caller checks each
-- candidate against what it may show, with secrets masked, so a masked value
-- is never found; candidates are few, the scan is the cost.
--
-- Lower-casing every envelope would cost more than reading it, so the scan
-- looks for one byte of the needle, its anchor (the caller picks a rare one),
-- in either case with plain finds, and compares the lower-cased window around
-- each hit with the needle.
--
-- KEYS[1] dlq
-- ARGV[1] where to start, inclusive (an entry id, or '+' for the newest)   ARGV[2] entries to read
-- ARGV[3] the needle, ASCII letters lower-cased   ARGV[4] the anchor's position in the needle (1-based)
-- Returns {entries read, where to start next ('' when the oldest entry was read), candidate id, ...}

local count = tonumber(ARGV[2])
local rows = redis.call('XREVRANGE', KEYS[1], ARGV[1], '-', 'COUNT', count + 1)
local needle, at = ARGV[3], tonumber(ARGV[4])
local find, lower, sub = string.find, string.lower, string.sub
local width = #needle
local anchor = sub(needle, at, at)
local cases = {anchor}
if string.upper(anchor) ~= anchor then
  cases[2] = string.upper(anchor)
end

local function holds(text)
  for c = 1, #cases do
    local from = at
    while true do
      local p = find(text, cases[c], from, true)
      if not p then
        break
      end
      local start = p - at + 1
      if lower(sub(text, start, start + width - 1)) == needle then
        return true
      end
      from = p + 1
    end
  end
  return false
end

local out = {0, ''}
local read = math.min(#rows, count)
for i = 1, read do
  local fields = rows[i][2]
  for k = 1, #fields, 2 do
    local name = fields[k]
    if (name == 'j' or name == 'error') and holds(fields[k + 1]) then
      out[#out + 1] = rows[i][1]
      break
    end
  end
end
out[1] = read
if #rows > count then
  out[2] = rows[count + 1][1]
end
return out
