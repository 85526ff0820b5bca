-- The dead-letter index: helpers for the scripts that write or remove DLQ
-- entries (settle.lua, dlq_move.lua, dlq_discard.lua, dlq_reindex.lua, dlq_trim.lua).
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
--   fc         hash: fingerprint id -> its error class (a class's entries are its groups' f: sets)
--   ft:<fp>    hash: task -> entries of that fingerprint
--   t:<task>, r:<reason>, f:<fp>
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
-- Beside the index (not under ix:, so a rebuild keeps them), <dlq>:tb:<fp> holds
-- the tracebacks the entries of group fp name by id (engine/dlq/shared.py), and
-- the set <dlq>:tbgroups names the groups that may have such a hash. The hash is
-- deleted with the group's last entry, but only while the index is whole (it
-- counts every entry): mid-rebuild a group's count says nothing of its entries
-- not indexed yet, so the hash is left to dlq_texts_sweep, which the rebuild
-- runs when its pass ends.
--
-- dlq_index_batch(dlq), dlq_index_put(batch, id, task, reason, class, fp, text, job_id), dlq_index_flush(batch)
--   Index entries not indexed yet (ids XADD returned): put each in a batch, then
--   flush it once, which writes each key once for the whole batch (one ZADD
--   per value, one HINCRBY per count) rather than a dozen commands an entry.
-- dlq_removal(dlq), dlq_take(removal, id), dlq_removal_flush(removal)
--   Remove entries: dlq_take reads an entry's fields, deletes it and notes
--   what its index holds (when it was indexed), and returns the fields, or
--   false when the entry was not there (so two callers never both take it);
--   dlq_removal_flush then undoes the notes of every entry taken, a command
--   per key rather than a dozen per entry.
-- dlq_indexed(dlq, entries, from, step), dlq_take_known(removal, id, reason, task, class, fp, job_id, indexed)
--   The same for entries whose fields the caller read (replay): dlq_indexed tells,
--   with one ZMSCORE per reason, which of the entries laid flat in `entries` (from
--   index `from`, every `step` items: id, then reason at +4) the index holds;
--   dlq_take_known deletes one (the XDEL gates it) and notes its index from the
--   fields given, with no read of the entry: an id is never reused, so the fields
--   of an entry still there are those the caller read.
-- dlq_texts_put(batch, fp, texts)
--   Note the shared texts of an entry of group fp (msgpack [id, text, ...], or ""),
--   written by dlq_index_flush, one HSET per group.
-- dlq_index_tally(batch, task, reason, class, fp, score, id)
--   What adding or removing one entry changes, noted in a batch or a removal:
--   its id in each value's zset (with its score when adding; nil when
--   removing), the counts, its error group and the group's tasks.
-- dlq_index_whole(dlq)
--   Whether the index counts every entry of the stream (its version, no rebuild
--   under way, as many entries as XLEN): a group's count is then all of its entries.
-- dlq_texts_sweep(dlq)
--   When the index is whole, delete the shared texts of every group named in
--   <dlq>:tbgroups that has no entry left (an entry removed while a rebuild had
--   not indexed it yet leaves its group's texts behind). Returns the hashes deleted.
-- DLQ_INDEX_VERSION
--   The index's layout (keys.py), recorded in v with the first entry indexed.
-- INVALID_RETRY_FP, INVALID_RETRY_TEXT
--   The fingerprint settle.lua gives a retry it could not schedule (computed
--   in Python, where fingerprints are, and written in at load).

local INVALID_RETRY_FP, INVALID_RETRY_TEXT = '${INVALID_RETRY_FP}', '${INVALID_RETRY_TEXT}'
local DLQ_INDEX_VERSION = '${INDEX_VERSION}'

local function dlq_index_score(id)
  local at, seq = string.match(id, '^(%d+)-(%d+)')
  return string.format('%.0f', tonumber(at) * 2048 + math.min(tonumber(seq), 2047))
end

local function dlq_index_tally(b, task, reason, class, fp, score, id)
  for _, key in ipairs({'r:' .. reason, 't:' .. task, 'f:' .. fp}) do
    local z = b.zsets[key]
    if not z then
      z = {}
      b.zsets[key] = z
    end
    if score then
      z[#z + 1] = score
    end
    z[#z + 1] = id
  end
  for _, field in ipairs({'t:' .. task, 'r:' .. reason, 'c:' .. class}) do
    b.counts[field] = (b.counts[field] or 0) + 1
  end
  b.n = b.n + 1
  b.groups[fp] = (b.groups[fp] or 0) + 1
  local tasks = b.group_tasks[fp]
  if not tasks then
    tasks = {}
    b.group_tasks[fp] = tasks
  end
  tasks[task] = (tasks[task] or 0) + 1
  b.classes[fp] = class
end

local function dlq_index_batch(dlq)
  return {p = dlq .. ':ix:', dlq = dlq, n = 0, zsets = {}, counts = {}, groups = {}, group_tasks = {}, texts = {},
    jobs = {}, classes = {}, shared = {}}
end

local function dlq_texts_put(b, fp, texts)
  if texts and texts ~= '' then
    local pairs_of = b.shared[fp]
    if not pairs_of then
      pairs_of = {}
      b.shared[fp] = pairs_of
    end
    for _, part in ipairs(cmsgpack.unpack(texts)) do
      pairs_of[#pairs_of + 1] = part
    end
  end
end

local function dlq_index_put(b, id, task, reason, class, fp, text, job_id)
  local score = dlq_index_score(id)
  dlq_index_tally(b, task, reason, class, fp, score, id)
  b.texts[fp] = text
  if job_id ~= '' then
    b.jobs[#b.jobs + 1] = job_id
    b.jobs[#b.jobs + 1] = id
  end
end

local function dlq_index_flush(b)
  if b.n == 0 then
    return
  end
  local p = b.p
  for key, z in pairs(b.zsets) do
    call_in_chunks('ZADD', p .. key, z, 4000)
  end
  local n = p .. 'n'
  if redis.call('HINCRBY', n, 'all', b.n) == b.n and redis.call('HSETNX', p .. 'v', 'version', DLQ_INDEX_VERSION) == 1
      and redis.call('XLEN', b.dlq) > b.n then
    -- the first entries indexed, beside older ones: have the readers rebuild rather than trust the index
    redis.call('HSET', p .. 'v', 'version', 'unindexed')
  end
  for field, count in pairs(b.counts) do
    redis.call('HINCRBY', n, field, count)
  end
  for fp, count in pairs(b.groups) do
    if tonumber(redis.call('ZINCRBY', p .. 'groups', count, fp)) == count then
      if b.texts[fp] ~= '' then
        redis.call('HSET', p .. 'fp', fp, b.texts[fp])
      end
      redis.call('HSET', p .. 'fc', fp, b.classes[fp])
    end
    for task, c in pairs(b.group_tasks[fp]) do
      redis.call('HINCRBY', p .. 'ft:' .. fp, task, c)
    end
  end
  call_in_chunks('HSET', p .. 'jobs', b.jobs, 4000)
  local registered = {}
  for fp, texts in pairs(b.shared) do
    call_in_chunks('HSET', b.dlq .. ':tb:' .. fp, texts, 4000)
    registered[#registered + 1] = fp
  end
  call_in_chunks('SADD', b.dlq .. ':tbgroups', registered, 4000)
end

local function dlq_index_whole(dlq)
  local p = dlq .. ':ix:'
  local state = redis.call('HMGET', p .. 'v', 'version', 'cursor')
  return state[1] == DLQ_INDEX_VERSION and not state[2]
    and tonumber(redis.call('HGET', p .. 'n', 'all') or '0') == redis.call('XLEN', dlq)
end

local function dlq_texts_sweep(dlq)
  if not dlq_index_whole(dlq) then
    return 0
  end
  local registry = dlq .. ':tbgroups'
  local fps = redis.call('SMEMBERS', registry)
  local gone = {}
  for s = 1, #fps, 1000 do
    local e = math.min(s + 999, #fps)
    local counts = redis.call('ZMSCORE', dlq .. ':ix:groups', unpack(fps, s, e))
    for k = s, e do
      if not counts[k - s + 1] then
        gone[#gone + 1] = fps[k]
      end
    end
  end
  local deleted = 0
  for _, fp in ipairs(gone) do
    deleted = deleted + redis.call('DEL', dlq .. ':tb:' .. fp)
  end
  call_in_chunks('SREM', registry, gone, 4000)
  return deleted
end

local function dlq_removal(dlq)
  return {p = dlq .. ':ix:', dlq = dlq, n = 0, zsets = {}, counts = {}, groups = {}, group_tasks = {}, jobs = {},
    legacy = {}, classes = {}}
end

local function dlq_take(b, id)
  local rows = redis.call('XRANGE', b.dlq, id, id)
  if #rows == 0 or redis.call('XDEL', b.dlq, id) == 0 then
    return false
  end
  local fields = rows[1][2]
  local f = {}
  for k = 1, #fields, 2 do
    f[fields[k]] = fields[k + 1]
  end
  local p = b.p
  local reason = f['reason'] or ''
  if not redis.call('ZSCORE', p .. 'r:' .. reason, id) then
    return fields
  end
  local task, class, fp, job_id = f['task'] or '', f['error_class'] or '', f['fp'], f['job_id'] or ''
  if not fp then
    fp = ''
    local packed = redis.call('HGET', p .. 'legacy', id)
    if packed then
      local l = cmsgpack.unpack(packed)
      fp, task, job_id = l[1], l[2], l[3]
      b.legacy[#b.legacy + 1] = id
    end
  end
  dlq_index_tally(b, task, reason, class, fp, nil, id)
  if job_id ~= '' then
    b.jobs[#b.jobs + 1] = {job_id, id}
  end
  return fields
end

local function dlq_indexed(dlq, entries, from, step)
  local by_reason, indexed = {}, {}
  for i = from, #entries, step do
    local reason = entries[i + 4]
    local ids = by_reason[reason]
    if not ids then
      ids = {}
      by_reason[reason] = ids
    end
    ids[#ids + 1] = entries[i]
  end
  for reason, ids in pairs(by_reason) do
    for s = 1, #ids, 4000 do
      local e = math.min(s + 3999, #ids)
      local scores = redis.call('ZMSCORE', dlq .. ':ix:r:' .. reason, unpack(ids, s, e))
      for k = s, e do
        if scores[k - s + 1] then
          indexed[ids[k]] = true
        end
      end
    end
  end
  return indexed
end

local function dlq_take_known(b, id, reason, task, class, fp, job_id, indexed)
  if redis.call('XDEL', b.dlq, id) == 0 then
    return false
  end
  if indexed then
    dlq_index_tally(b, task, reason, class, fp, nil, id)
    if job_id ~= '' then
      b.jobs[#b.jobs + 1] = {job_id, id}
    end
  end
  return true
end

local function dlq_removal_flush(b)
  if b.n == 0 then
    return
  end
  local p = b.p
  for key, z in pairs(b.zsets) do
    call_in_chunks('ZREM', p .. key, z, 4000)
  end
  local n = p .. 'n'
  b.counts['all'] = b.n
  for field, count in pairs(b.counts) do
    if redis.call('HINCRBY', n, field, -count) <= 0 then
      redis.call('HDEL', n, field)
    end
  end
  local whole
  for fp, count in pairs(b.groups) do
    if tonumber(redis.call('ZINCRBY', p .. 'groups', -count, fp)) <= 0 then
      redis.call('ZREM', p .. 'groups', fp)
      redis.call('HDEL', p .. 'fp', fp)
      redis.call('HDEL', p .. 'fc', fp)
      redis.call('DEL', p .. 'ft:' .. fp)
      if whole == nil then
        whole = dlq_index_whole(b.dlq)
      end
      if whole then
        -- the group's last entry: no entry names its texts any more
        redis.call('DEL', b.dlq .. ':tb:' .. fp)
        redis.call('SREM', b.dlq .. ':tbgroups', fp)
      end
    else
      for task, c in pairs(b.group_tasks[fp]) do
        if redis.call('HINCRBY', p .. 'ft:' .. fp, task, -c) <= 0 then
          redis.call('HDEL', p .. 'ft:' .. fp, task)
        end
      end
    end
  end
  for s = 1, #b.jobs, 1000 do
    local names = {}
    for k = s, math.min(s + 999, #b.jobs) do
      names[#names + 1] = b.jobs[k][1]
    end
    local current = redis.call('HMGET', p .. 'jobs', unpack(names))
    local gone = {}
    for k = 1, #names do
      if current[k] == b.jobs[s + k - 1][2] then
        gone[#gone + 1] = names[k]
      end
    end
    if #gone > 0 then
      redis.call('HDEL', p .. 'jobs', unpack(gone))
    end
  end
  call_in_chunks('HDEL', p .. 'legacy', b.legacy, 4000)
end
