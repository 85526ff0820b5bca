-- Build the DLQ's index for entries written before it existed (or by a
-- writer that did not keep it), a chunk at a time; see engine/dlq/index.py.
--
-- KEYS[1] dlq
-- ARGV[1] 'reset': drop the whole index and start a rebuild from the first entry.
--         ARGV[2] the index version to record. Returns 1.
-- ARGV[1] 'start': start a rebuild pass from the first entry over the index as
--         it is (entries already indexed are left alone). ARGV[2] version. Returns 1.
-- ARGV[1] 'chunk': index a chunk of entries the caller read from the stream.
--         ARGV[2] the cursor the chunk starts after (the pass's cursor when it
--         was read); ARGV[3] the id of the chunk's last entry, the new cursor,
--         or '' when the chunk reached the end of the stream (the pass is over);
--         then five arguments per entry: entry id, fingerprint id, fingerprint
--         text, task, job id. The last four are the caller's reading of an entry
--         written without an `fp` field; for an entry that has one they are
--         ignored (its own fields are indexed). An entry no longer in the stream
--         is skipped. The cursor moves only if it is still ARGV[2] (a second
--         rebuilder that read the same chunk moves nothing and counts nothing).
--         Returns the number of entries this call indexed. The chunk that ends
--         the pass also deletes the shared texts of groups left without an entry
--         (dlq_texts_sweep), once the index counts every entry.
--
-- Calls dlq_index_batch, dlq_index_put and dlq_index_flush from dlq_index.lua.

local dlq = KEYS[1]
local p = dlq .. ':ix:'
local v = p .. 'v'

if ARGV[1] == 'reset' or ARGV[1] == 'start' then
  -- the groups the index knows may have shared texts: the pass's end sweeps those left without an entry
  call_in_chunks('SADD', dlq .. ':tbgroups', redis.call('ZRANGE', p .. 'groups', 0, -1), 4000)
  if ARGV[1] == 'reset' then
    local n = redis.call('HGETALL', p .. 'n')
    local drop = {p .. 'n', p .. 'groups', p .. 'fp', p .. 'fc', p .. 'jobs', p .. 'legacy'}
    for k = 1, #n, 2 do
      if n[k] ~= 'all' then
        drop[#drop + 1] = p .. n[k]
      end
    end
    for _, fp in ipairs(redis.call('ZRANGE', p .. 'groups', 0, -1)) do
      drop[#drop + 1] = p .. 'f:' .. fp
      drop[#drop + 1] = p .. 'ft:' .. fp
    end
    call_in_chunks('UNLINK', nil, drop, 1000)
  end
  redis.call('HSET', v, 'version', ARGV[2], 'cursor', '0-0')
  return 1
end

if redis.call('HGET', v, 'cursor') ~= ARGV[2] then
  return 0
end
local added, legacy = 0, {}
local batch = dlq_index_batch(dlq)
for i = 4, #ARGV, 5 do
  local id = ARGV[i]
  local rows = redis.call('XRANGE', dlq, id, id)
  if #rows > 0 then
    local f = {}
    local fields = rows[1][2]
    for k = 1, #fields, 2 do
      f[fields[k]] = fields[k + 1]
    end
    local reason, class = f['reason'] or '', f['error_class'] or ''
    if not redis.call('ZSCORE', p .. 'r:' .. reason, id) then
      if f['fp'] then
        dlq_index_put(batch, id, f['task'] or '', reason, class, f['fp'], ARGV[i + 2], f['job_id'] or '')
      else
        dlq_index_put(batch, id, ARGV[i + 3], reason, class, ARGV[i + 1], ARGV[i + 2], ARGV[i + 4])
        legacy[#legacy + 1] = id
        legacy[#legacy + 1] = cmsgpack.pack({ARGV[i + 1], ARGV[i + 3], ARGV[i + 4]})
      end
      added = added + 1
    end
  end
end
dlq_index_flush(batch)
call_in_chunks('HSET', p .. 'legacy', legacy, 4000)
if ARGV[3] == '' then
  redis.call('HDEL', v, 'cursor')
  dlq_texts_sweep(dlq)
else
  redis.call('HSET', v, 'cursor', ARGV[3])
end
return added
