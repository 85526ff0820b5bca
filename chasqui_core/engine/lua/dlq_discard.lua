-- Delete dead-letter entries for good, and their place in the DLQ's index.
--
-- KEYS[1] dlq
-- ARGV    entry ids
-- Returns the number of entries deleted (those someone else removed first are not counted).
--
-- Calls dlq_take from dlq_index.lua.

local removed = 0
for i = 1, #ARGV do
  if dlq_take(KEYS[1], ARGV[i]) then
    removed = removed + 1
  end
end
return removed
