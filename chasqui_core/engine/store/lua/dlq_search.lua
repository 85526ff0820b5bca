-- Scan one chunk of a DLQ, newest first, for entries whose text holds a needle, whatever its case.
--
-- An entry is a candidate when the needle is found in its envelope bytes
-- (which hold the job id, the task, the arguments and the error history with
-- each error's class and message, but for the last error's, which entries
-- written since the shared texts leave to the entry: engine/dlq/shared.py) or
-- in its last error's class or message, ASCII letters compared without case.
-- Only those three fields are read: each plain find is a call,
-- and calls, not bytes, are what a scan pays for. The caller checks each
-- candidate against what it may show, with secrets masked, so a masked value
-- is never found; candidates are few, the scan is the cost.
--
-- Lower-casing every envelope would cost more than reading it, so the scan
-- looks for one byte of the needle, its anchor (the caller picks a rare one),
-- in either case with plain finds, and compares the lower-cased window around
-- each hit with the needle.
--
-- Most of a scan's time is turning XREVRANGE's reply into Lua tables. That
-- costs about a quarter less per entry when the chunk is read in small steps
-- (a few hundred entries): each step's reply and tables stay in the CPU's
-- cache and are garbage before the next step, where one big read of the whole
-- chunk spills out of it. Entries written by settle.lua hold 'j', 'error_class'
-- and 'error' at fixed places (fields 1, 11 and 13); others are found by name.
--
-- KEYS[1] dlq
-- ARGV[1] where to start, inclusive (an entry id, or '+' for the newest)   ARGV[2] entries to read
-- ARGV[3] the needle, ASCII letters lower-cased   ARGV[4] the anchor's position in the needle (1-based)
-- ARGV[5] entries per XREVRANGE step
-- ARGV[6..] ids of shared tracebacks that hold the needle (engine/dlq/shared.py): an entry whose
--         envelope names one is a candidate too, found by a plain find of the id
-- Returns {entries read, where to start next ('' when the oldest entry was read), candidate id, ...}

local count, step = tonumber(ARGV[2]), tonumber(ARGV[5])
local needle, at = ARGV[3], tonumber(ARGV[4])
local find, lower, sub, min = string.find, string.lower, string.sub, math.min
local width = #needle
local anchor = sub(needle, at, at)
local upper = string.upper(anchor)
if upper == anchor then
  upper = nil
end

local function holds_case(text, case)
  local from = at
  while true do
    local p = find(text, case, from, true)
    if not p then
      return false
    end
    local start = p - at + 1
    if lower(sub(text, start, start + width - 1)) == needle then
      return true
    end
    from = p + 1
  end
end

local named = {}
for k = 6, #ARGV do
  named[#named + 1] = ARGV[k]
end

local function holds(text)
  return holds_case(text, anchor) or (upper ~= nil and holds_case(text, upper))
end

local function names_one(envelope)
  for k = 1, #named do
    if find(envelope, named[k], 1, true) then
      return true
    end
  end
  return false
end

local out = {0, ''}
local n = 2
local read = 0
local start = ARGV[1]
while true do
  local want = min(step, count - read)
  local rows = redis.call('XREVRANGE', KEYS[1], start, '-', 'COUNT', want + 1)
  local got = min(#rows, want)
  for i = 1, got do
    local fields = rows[i][2]
    local hit = false
    if fields[1] == 'j' and fields[11] == 'error_class' and fields[13] == 'error' then
      hit = holds(fields[2]) or holds(fields[14]) or holds(fields[12]) or (#named > 0 and names_one(fields[2]))
    else
      for k = 1, #fields, 2 do
        local name = fields[k]
        if (name == 'j' or name == 'error' or name == 'error_class') and holds(fields[k + 1])
            or name == 'j' and #named > 0 and names_one(fields[k + 1]) then
          hit = true
          break
        end
      end
    end
    if hit then
      n = n + 1
      out[n] = rows[i][1]
    end
  end
  read = read + got
  if #rows <= want then
    start = ''
    break
  end
  start = rows[want + 1][1]
  if read >= count then
    break
  end
end
out[1] = read
out[2] = start
return out
