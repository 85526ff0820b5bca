-- Scan one chunk of a DLQ, newest first, for entries whose text holds a needle.
--
-- An entry is a candidate when the lower-cased needle is found (plain find,
-- no patterns) in its lower-cased job id, task, error class, last error or
-- envelope bytes (which hold the arguments and the error history). The caller
-- checks each candidate against what it may show, with secrets masked, so a
-- masked value is never found; candidates are few, the scan is the cost.
--
-- KEYS[1] dlq
-- ARGV[1] where to start, inclusive (an entry id, or '+' for the newest)   ARGV[2] entries to read
-- ARGV[3] the needle
-- Returns {entries read, where to start next ('' when the oldest entry was read), candidate id, ...}

local count = tonumber(ARGV[2])
local rows = redis.call('XREVRANGE', KEYS[1], ARGV[1], '-', 'COUNT', count + 1)
local needle = string.lower(ARGV[3])
local find, lower = string.find, string.lower
local out = {0, ''}
local read = math.min(#rows, count)
for i = 1, read do
  local fields = rows[i][2]
  for k = 1, #fields, 2 do
    local name = fields[k]
    if (name == 'j' or name == 'task' or name == 'error' or name == 'job_id' or name == 'error_class')
        and find(lower(fields[k + 1]), needle, 1, true) then
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
