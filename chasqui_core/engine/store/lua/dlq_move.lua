-- Send dead-letter entries back to work (replay), each at most once.
--
-- Taking the entry (dlq_take_known: XDEL, note its index from the fields the
-- caller read) gates each move: when two operators replay the same entry at
-- the same time, only the call that deleted it re-publishes it, and the index
-- loses it once. The entry is not read here: that read cost more than the
-- rest of a move (an entry without `fp`, written before the index, is read
-- with dlq_take, since its index entry is kept apart).
--
-- KEYS[1] dlq   KEYS[2] stream   KEYS[3] delayed   KEYS[4] all-time totals (counts "replayed")
--         (KEYS[2] is the default band's stream: a prioritised job goes back to its
--         band's stream, prelude's band_stream)
-- ARGV[1] the replay marks' key prefix ({chasqui:<q>}:rjob:)   ARGV[2] their lifetime (ms)
-- ARGV[3..] nine per entry: dlq entry id, payload to publish, run at epoch ms ("" = now), job id (for its
--         mark), then the entry's fields as read: reason, task, error_class, fp ("" when it has none), job_id
-- Returns the number of entries moved.
--
-- A job sent to the delayed set gets its mark there (mark_delayed); a job sent
-- to a stream gets a replay mark, <prefix><job id> = "<band> <stream entry id>",
-- so a lookup by id reads its new entry instead of scanning the stream for it.
--
-- Calls server_ms and mark_delayed from prelude.lua; dlq_removal, dlq_indexed, dlq_take_known, dlq_take and
-- dlq_removal_flush from dlq_index.lua.

local dlq, stream, delayed = KEYS[1], KEYS[2], KEYS[3]
local removal = dlq_removal(dlq)
local moved = 0
local now
local marks, life = ARGV[1], ARGV[2]
local indexed = dlq_indexed(dlq, ARGV, 3, 9)
for i = 3, #ARGV, 9 do
  local taken
  if ARGV[i + 7] == '' then
    taken = dlq_take(removal, ARGV[i])
  else
    taken = dlq_take_known(removal, ARGV[i], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8],
      indexed[ARGV[i]])
  end
  if taken then
    if ARGV[i + 2] == '' then
      local band = band_of(ARGV[i + 1])
      local eid = redis.call('XADD', band_stream(stream, band), '*', 'j', ARGV[i + 1])
      if ARGV[i + 3] ~= '' then
        redis.call('SET', marks .. ARGV[i + 3], band .. ' ' .. eid, 'PX', life)
      end
    else
      local at = tonumber(ARGV[i + 2])
      redis.call('ZADD', delayed, at, ARGV[i + 1])
      now = now or server_ms()
      mark_delayed(delayed, ARGV[i + 1], at, now)
    end
    moved = moved + 1
  end
end
dlq_removal_flush(removal)
if moved > 0 then
  redis.call('HINCRBY', KEYS[4], 'replayed', moved)
end
return moved
