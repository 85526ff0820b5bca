-- Settle a batch of finished deliveries in one atomic call: acknowledge
-- successes (marking their idempotency keys completed), re-publish failures
-- through the delayed set, route dead jobs to the dead-letter queue, put
-- unstarted jobs back on the stream, and acknowledge jobs not run because
-- their idempotency key had completed.
--
-- Every item is gated on its XACK: an entry that is no longer pending (the
-- call was repeated, or it was settled already) is left alone, so a retried
-- call is harmless and no job is ever both re-published and dead. The
-- entries acknowledged one by one are deleted from the stream together, with
-- one XDEL at the end: a command per entry costs more than the deletion.
--
-- KEYS[1] stream   KEYS[2] delayed   KEYS[3] dlq   KEYS[4] events
-- KEYS[5] the settling worker's start journal ({chasqui:<q>}:running:<worker>):
--         every entry this call settles loses its mark there
-- ARGV[1] consumer group
-- ARGV[2] prefix of the metrics counters ({chasqui:<q>}:m:): the time buckets,
--         the all-time counters and the run-duration histogram <prefix>durations
-- ARGV[3] approximate cap of the events stream
-- ARGV[4] completed-event blob (msgpack list of [job id, task, ms]; "" for none)
-- ARGV[5] number of completed entries C, then their stream ids joined by spaces
--         in one argument (one argument instead of C keeps the call cheap to send)
-- then    number of stored results R, then R quadruples: key, ttl ms, value, gate: "" (a success's result,
--         stored whether or not this call acknowledged the entry: the run did succeed) or the stream id of the
--         entry whose retry or death it records, stored only if this call acknowledged that entry (a late
--         outcome of a worker cut off past its lease must not overwrite what the run that took over wrote)
-- then    number of retries N and, when N > 0, two arguments: one msgpack array
--         of 3 items per retry laid flat: stream id, delay ms, payload; then the
--         retries' events record, a msgpack array of N entries in the same
--         order: [job id, task, attempt, delay ms, duration ms, error class,
--         error message]. It goes to the events stream as it is when every
--         retry was scheduled (the usual case), so the script only unpacks it
--         when some were not. Each retry's mark (the job id read from its
--         payload's head, see mark_delayed) is written with it
-- then    number of dead jobs D and, when D > 0, one msgpack array of 12 items per
--         job laid flat: stream id, payload, reason, task, job id, error class,
--         error message, counts-as-failure (0/1), duration ms, error fingerprint
--         id, fingerprint text (the worker computes them: engine/dlq/fingerprint.py),
--         shared texts: "" or a msgpack array [text id, traceback, ...] of the
--         tracebacks the payload names by id (engine/dlq/shared.py), kept once
--         per error group in <dlq>:tb:<fingerprint id>
-- (one packed argument per section keeps a batch cheap to send)
-- then    number of requeues Q, then Q pairs: stream id, payload
-- then    number of histogram fields H and, when H > 0, one msgpack array of
--         H pairs laid flat: field of <prefix>durations, amount to add (the
--         worker counts a batch's runs per task and bucket, see engine/ops/totals.py)
-- then    number of idempotency markers M, then M triples: marker key
--         ({chasqui:<q>}:done:<key>), id of the job that succeeded, ttl ms. Set
--         whether or not this call acknowledged the entry: the run did succeed
--         (a worker whose lease lapsed may settle after the one that took over)
-- then    number of skipped jobs K and, when K > 0, one msgpack array of 5 items
--         per job laid flat: stream id, job id, task, idempotency key, id of the
--         job that completed the key
-- then    number of entries fetched since the last call (the `fetched` counter)
-- then    number of workflow ends F (absent: 0) and, when F > 0, one msgpack array
--         of 5 items per end laid flat: stream id, batch id, job id, outcome
--         ("ok" or "dead"), return value as raw msgpack ("" for none); see
--         flows.lua. A success counts whether or not this call acknowledged it
--         (the run did succeed); a death only when this call dead-lettered it
-- Returns {server ms, completed, retried, dead, requeued, earliest retry due ms or -1,
--          problems: a list of "stream id or result key: what went wrong" for items
--          that could not be applied as asked, skipped}
--
-- Dead jobs are counted as `dlq` and per reason as `dlq:<reason>`; those whose
-- reason is bad_signature also as `bad_signature`, skipped ones as `skipped`.
--
-- One bad item never fails the batch: a result that cannot be stored is
-- skipped and reported, and a retry whose delay is not a number goes to the
-- dead-letter queue as `internal` instead of being lost. Each item's values
-- are checked before its XACK, so an item is either applied whole or not
-- acknowledged at all.
--
-- The dead-letter entries written are indexed together at the end (counts per
-- task, reason, error class and fingerprint, the entry's id under each, its
-- job id), so the console reads them without scanning; see dlq_index.lua.
--
-- Calls server_ms, call_in_chunks, bump_counters, durations_key and mark_delayed from prelude.lua;
-- dlq_index_batch, dlq_index_put, dlq_texts_put and dlq_index_flush from dlq_index.lua; settle_flow_ends
-- from flows.lua.

local stream, delayed, dlq, events, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, mprefix, evcap = ARGV[1], ARGV[2], ARGV[3]
local now = server_ms()
local i = 5

local acked = {}
local index = dlq_index_batch(dlq)  -- the dead-letter entries written, indexed together at the end

-- acknowledge one entry; true when it was pending. It is deleted with the others at the end.
local function settle(id)
  if redis.call('XACK', stream, group, id) == 1 then
    acked[#acked + 1] = id
    return true
  end
  return false
end

-- XDEL the ids and drop their journal marks
local function delete(ids)
  call_in_chunks('XDEL', stream, ids, 4000)
  call_in_chunks('HDEL', running, ids, 4000)
end

-- dead jobs per reason, for the dlq:<reason> counters
local reasons = {}
local function count_reason(reason)
  reasons[reason] = (reasons[reason] or 0) + 1
end

-- the one way a job enters the dead-letter queue here: its entry, its place in the index, its event, its count
local function dead_letter(source_id, payload, reason, task, job_id, error_class, error, fp, fp_text, duration,
                           texts)
  local eid = redis.call('XADD', dlq, '*', 'j', payload, 'reason', reason, 'task', task, 'job_id', job_id,
    'source_id', source_id, 'error_class', error_class, 'error', error, 'fp', fp)
  dlq_index_put(index, eid, task, reason, error_class, fp, fp_text, job_id)
  dlq_texts_put(index, fp, texts)
  redis.call('XADD', events, 'MAXLEN', '~', evcap, '*', 'type', 'dlq', 'job_id', job_id, 'task', task,
    'reason', reason, 'error_class', error_class, 'error', error, 'duration_ms', duration)
  count_reason(reason)
end


-- successes
local completed = 0
local c = tonumber(ARGV[i]); i = i + 1
if c > 0 then
  local ids = {}
  for id in string.gmatch(ARGV[i], '%S+') do ids[#ids + 1] = id end
  for s = 1, #ids, 4000 do  -- XACK names its group before the ids: chunked here rather than by call_in_chunks
    local e = math.min(s + 3999, #ids)
    completed = completed + redis.call('XACK', stream, group, unpack(ids, s, e))
    redis.call('XDEL', stream, unpack(ids, s, e))
    redis.call('HDEL', running, unpack(ids, s, e))
  end
  i = i + 1
  if ARGV[4] ~= '' and completed > 0 then
    redis.call('XADD', events, 'MAXLEN', '~', evcap, '*', 'type', 'completed', 'count', completed, 'jobs', ARGV[4])
  end
end

local problems = {}

-- results: a success's now; a failure's once its entry is known to be acknowledged by this call (gated)
local function store_result(key, ttl, value)
  if ttl and ttl > 0 then
    local reply = redis.pcall('SET', key, value, 'PX', ttl)
    if type(reply) == 'table' and reply.err then
      problems[#problems + 1] = key .. ': ' .. reply.err
    end
  else
    problems[#problems + 1] = key .. ': result ttl is not a positive number (' .. tostring(ttl) .. ')'
  end
end
local gated = {}
local r = tonumber(ARGV[i]); i = i + 1
for k = 1, r do
  if ARGV[i + 3] == '' then
    store_result(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2])
  else
    gated[#gated + 1] = i
  end
  i = i + 4
end

-- retries
local retried, earliest, internal = 0, -1, 0
local n = tonumber(ARGV[i]); i = i + 1
if n > 0 then
  local r, record = cmsgpack.unpack(ARGV[i]), ARGV[i + 1]; i = i + 2
  local jobs, scheduled, due = nil, {}, {}
  for j = 1, #r, 3 do
    local k = (j + 2) / 3  -- this retry's entry in the events record
    local id, delay, payload = r[j], tonumber(r[j + 1]), r[j + 2]
    if not delay or delay ~= delay or delay < 0 or delay > 3153600000000 then
      -- not a wait anyone meant: keep the job, in the dead-letter queue, with what went wrong
      local why = 'the retry delay is not a usable number of milliseconds (' .. tostring(r[j + 1]) .. ')'
      problems[#problems + 1] = tostring(id) .. ': ' .. why
      if settle(id) then
        jobs = jobs or cmsgpack.unpack(record)
        local job_id, task, duration = jobs[k][1], jobs[k][2], jobs[k][5]
        dead_letter(id, payload, 'internal', task, job_id, 'InvalidRetry', why, INVALID_RETRY_FP, INVALID_RETRY_TEXT,
          duration, '')
        internal = internal + 1
      end
    elseif settle(id) then
      local at = now + delay
      due[#due + 1] = at
      due[#due + 1] = payload
      mark_delayed(delayed, payload, at, now)
      retried = retried + 1
      if earliest < 0 or at < earliest then earliest = at end
      scheduled[#scheduled + 1] = k
    end
  end
  call_in_chunks('ZADD', delayed, due, 4000)  -- one ZADD for the batch
  if retried > 0 then  -- one events entry for the batch, as for completions
    if retried < n then  -- keep the entries of the retries scheduled
      jobs = jobs or cmsgpack.unpack(record)
      for s = 1, retried do scheduled[s] = jobs[scheduled[s]] end
      record = cmsgpack.pack(scheduled)
    end
    redis.call('XADD', events, 'MAXLEN', '~', evcap, '*', 'type', 'retry_scheduled', 'count', retried,
      'jobs', record)
  end
end

-- dead jobs
local dead, failed_dead, bad_signature = internal, internal, 0
local d = tonumber(ARGV[i]); i = i + 1
if d > 0 then
  local r = cmsgpack.unpack(ARGV[i]); i = i + 1
  for j = 1, #r, 12 do
    local id = r[j]
    if settle(id) then
      dead_letter(id, r[j + 1], r[j + 2], r[j + 3], r[j + 4], r[j + 5], r[j + 6], r[j + 9], r[j + 10], r[j + 8],
        r[j + 11])
      dead = dead + 1
      failed_dead = failed_dead + (tonumber(r[j + 7]) or 0)
      if r[j + 2] == 'bad_signature' then bad_signature = bad_signature + 1 end
    end
  end
end

-- requeues (fetched but never started, at shutdown)
local requeued = 0
local q = tonumber(ARGV[i]); i = i + 1
for k = 1, q do
  if settle(ARGV[i]) then
    redis.call('XADD', stream, '*', 'j', ARGV[i + 1])
    requeued = requeued + 1
  end
  i = i + 2
end

-- the batch's run durations, counted per task and bucket by the worker; added
-- only when this call settled something, so a repeated call counts nothing twice
local h = tonumber(ARGV[i]); i = i + 1
if h > 0 then
  if completed + retried + dead > 0 then
    local histogram = cmsgpack.unpack(ARGV[i])
    local durations = durations_key(mprefix)
    for k = 1, #histogram, 2 do
      redis.call('HINCRBY', durations, histogram[k], histogram[k + 1])
    end
  end
  i = i + 1
end

-- idempotency markers of keyed jobs that succeeded
local m = tonumber(ARGV[i]); i = i + 1
for k = 1, m do
  local ttl = tonumber(ARGV[i + 2])
  if ttl and ttl > 0 then
    redis.call('SET', ARGV[i], ARGV[i + 1], 'PX', ttl)
  else
    problems[#problems + 1] = ARGV[i] .. ': marker ttl is not a positive number (' .. tostring(ARGV[i + 2]) .. ')'
  end
  i = i + 3
end

-- jobs acknowledged without running: their idempotency key had completed
local skipped = 0
local s = tonumber(ARGV[i]); i = i + 1
if s > 0 then
  local r = cmsgpack.unpack(ARGV[i]); i = i + 1
  local jobs = {}
  for j = 1, #r, 5 do
    if settle(r[j]) then
      skipped = skipped + 1
      jobs[#jobs + 1] = {r[j + 1], r[j + 2], r[j + 3], r[j + 4]}
    end
  end
  if skipped > 0 then  -- one events entry for the batch: [job id, task, key, completed by]
    redis.call('XADD', events, 'MAXLEN', '~', evcap, '*', 'type', 'skipped', 'count', skipped,
      'jobs', cmsgpack.pack(jobs))
  end
end

local fetched = tonumber(ARGV[i]) or 0
i = i + 1

-- workflow ends (flows.lua), after every other section: a dead child counts only when this call dead-lettered it
local f = tonumber(ARGV[i]) or 0
i = i + 1
if f > 0 then
  settle_flow_ends(stream, acked, cmsgpack.unpack(ARGV[i]))
  i = i + 1
end

if #gated > 0 then
  local was_acked = {}
  for _, id in ipairs(acked) do was_acked[id] = true end
  for _, at in ipairs(gated) do
    if was_acked[ARGV[at + 3]] then store_result(ARGV[at], tonumber(ARGV[at + 1]), ARGV[at + 2]) end
  end
end

delete(acked)
dlq_index_flush(index)

local failed = retried + failed_dead
local counts = {'completed', completed, 'failed', failed, 'retried', retried, 'dlq', dead,
  'skipped', skipped, 'bad_signature', bad_signature, 'fetched', fetched}
for reason, n in pairs(reasons) do
  counts[#counts + 1] = 'dlq:' .. reason
  counts[#counts + 1] = n
end
bump_counters(mprefix, now, counts)
return {now, completed, retried, dead, requeued, earliest, problems, skipped}
