-- The dead-letter index: helpers for the scripts that write or remove DLQ
-- entries (settle.lua, dlq_move.lua, dlq_discard.lua, dlq_reindex.lua).
--
-- scripts.py squeezes this file onto those scripts' first line after the
-- prelude, as it does the prelude (comment lines dropped, code lines joined),
-- so a comment here must be on a line of its own, never after code.
--
-- The index lives beside the DLQ stream under the queue's hash tag, in keys
-- that start with <dlq>:ix: (engine/dlq/index.py reads them):
--   n          hash: entries indexed (all), and per value t:<task>, r:<reason>, c:<error class>
--   groups     zset: fingerprint id -> entries
--   fp         hash: fingerprint id -> fingerprint text
--   ft:<fp>    hash: task -> entries of that fingerprint
--   t:<task>, r:<reason>, c:<class>, f:<fp>
--              zsets: entry id, score = the id's millisecond * 2048 + its sequence
--              (at most 2047), so the sets keep the stream's order (exact in a
--              double until the year 2109)
--   jobs       hash: job id -> entry id (its newest entry)
--   legacy     hash: entry id -> msgpack [fp, task, job id] for entries written
--              without an fp field (before the index existed), as the rebuild
--              indexed them, so their removal undoes exactly that
--   v          hash: the index's version, and the rebuild's cursor while one runs
-- An entry is indexed when its id is in r:<its reason>; adding and removing
-- both check that first, so neither ever counts an entry twice.
--
-- dlq_index_add(dlq, id, task, reason, class, fp, text, job_id)
--   Index one entry (an id XADD returned). Returns true when it was not indexed yet.
-- dlq_index_remove(dlq, id, fields)
--   Undo the index of an entry whose fields (a flat list, as XRANGE gives
--   them) were read before it was deleted; nothing when it was never indexed.
-- dlq_take(dlq, id)
--   Read an entry's fields, delete it and undo its index. Returns the fields,
--   or false when the entry was not there (so two callers never both take it).
-- DLQ_INDEX_VERSION
--   The index's layout (keys.py), recorded in v with the first entry indexed.
-- INVALID_RETRY_FP, INVALID_RETRY_TEXT
--   The fingerprint settle.lua gives a retry it could not schedule (computed
--   in Python, where fingerprints are, and written in at load).

local INVALID_RETRY_FP, INVALID_RETRY_TEXT = '${INVALID_RETRY_FP}', '${INVALID_RETRY_TEXT}'
local DLQ_INDEX_VERSION = '${INDEX_VERSION}'

local function dlq_index_add(dlq, id, task, reason, class, fp, text, job_id)
  local p = dlq .. ':ix:'
  local at, seq = string.match(id, '^(%d+)-(%d+)')
  local ms = string.format('%.0f', tonumber(at) * 2048 + math.min(tonumber(seq), 2047))
  if redis.call('ZADD', p .. 'r:' .. reason, ms, id) == 0 then
    return false
  end
  if redis.call('HSETNX', p .. 'v', 'version', DLQ_INDEX_VERSION) == 1 and redis.call('XLEN', dlq) > 1 then
    -- the first entry indexed, beside older ones: have the readers rebuild rather than trust it
    redis.call('HSET', p .. 'v', 'version', 'unindexed')
  end
  redis.call('ZADD', p .. 't:' .. task, ms, id)
  redis.call('ZADD', p .. 'c:' .. class, ms, id)
  redis.call('ZADD', p .. 'f:' .. fp, ms, id)
  local n = p .. 'n'
  redis.call('HINCRBY', n, 'all', 1)
  redis.call('HINCRBY', n, 't:' .. task, 1)
  redis.call('HINCRBY', n, 'r:' .. reason, 1)
  redis.call('HINCRBY', n, 'c:' .. class, 1)
  redis.call('ZINCRBY', p .. 'groups', 1, fp)
  redis.call('HINCRBY', p .. 'ft:' .. fp, task, 1)
  if text ~= '' then
    redis.call('HSET', p .. 'fp', fp, text)
  end
  if job_id ~= '' then
    redis.call('HSET', p .. 'jobs', job_id, id)
  end
  return true
end

local function dlq_index_remove(dlq, id, fields)
  local p = dlq .. ':ix:'
  local f = {}
  for k = 1, #fields, 2 do
    f[fields[k]] = fields[k + 1]
  end
  local reason = f['reason'] or ''
  if redis.call('ZREM', p .. 'r:' .. reason, id) == 0 then
    return
  end
  local task, class, fp, job_id = f['task'] or '', f['error_class'] or '', f['fp'], f['job_id'] or ''
  if not fp then
    local packed = redis.call('HGET', p .. 'legacy', id)
    fp = ''
    if packed then
      local l = cmsgpack.unpack(packed)
      fp, task, job_id = l[1], l[2], l[3]
      redis.call('HDEL', p .. 'legacy', id)
    end
  end
  redis.call('ZREM', p .. 't:' .. task, id)
  redis.call('ZREM', p .. 'c:' .. class, id)
  redis.call('ZREM', p .. 'f:' .. fp, id)
  local n = p .. 'n'
  for _, field in ipairs({'all', 't:' .. task, 'r:' .. reason, 'c:' .. class}) do
    if redis.call('HINCRBY', n, field, -1) <= 0 then
      redis.call('HDEL', n, field)
    end
  end
  if tonumber(redis.call('ZINCRBY', p .. 'groups', -1, fp)) <= 0 then
    redis.call('ZREM', p .. 'groups', fp)
    redis.call('HDEL', p .. 'fp', fp)
    redis.call('DEL', p .. 'ft:' .. fp)
  elseif redis.call('HINCRBY', p .. 'ft:' .. fp, task, -1) <= 0 then
    redis.call('HDEL', p .. 'ft:' .. fp, task)
  end
  if job_id ~= '' and redis.call('HGET', p .. 'jobs', job_id) == id then
    redis.call('HDEL', p .. 'jobs', job_id)
  end
end

local function dlq_take(dlq, id)
  local rows = redis.call('XRANGE', dlq, id, id)
  if #rows == 0 or redis.call('XDEL', dlq, id) == 0 then
    return false
  end
  dlq_index_remove(dlq, id, rows[1][2])
  return rows[1][2]
end
