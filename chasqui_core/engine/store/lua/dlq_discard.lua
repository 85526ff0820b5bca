-- Delete dead-letter entries for good, and their place in the DLQ's index.
--
-- KEYS[1] dlq
-- ARGV    entry ids
-- Returns the number of entries deleted (those someone else removed first are not counted).
--
-- Calls dlq_removal, dlq_take and dlq_removal_flush from dlq_index.lua.

local removal = dlq_removal(KEYS[1])
local removed = 0
for i = 1, #ARGV do
  if dlq_take(removal, ARGV[i]) then
    removed = removed + 1
  end
end
dlq_removal_flush(removal)
return removed
